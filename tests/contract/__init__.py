"""Tests of the cleanup and stream-terminal contract, clause by clause."""
