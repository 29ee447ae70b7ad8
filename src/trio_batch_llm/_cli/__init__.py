"""The ``trio-batch-llm`` command line: parsers, commands, the demo, terminal output."""
