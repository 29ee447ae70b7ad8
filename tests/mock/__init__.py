"""Tests of the mock server, every dialect."""
