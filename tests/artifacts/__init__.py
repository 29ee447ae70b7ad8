"""Tests of the checkpoint stores and resume."""
