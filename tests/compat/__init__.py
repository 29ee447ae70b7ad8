"""Tests of the async-batch-llm migration surface."""
