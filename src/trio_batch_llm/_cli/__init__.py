"""The ``trio-batch-llm`` command line (its public face is :mod:`trio_batch_llm.cli`)."""
