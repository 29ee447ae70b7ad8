"""async-batch-llm's public names that have a safe form here: base classes and records.

Each maps onto this library's own protocol (observers with ``on_event``, middlewares with
``before``/``after``, classifiers returning a category); docs/migration.md lists them.
"""
