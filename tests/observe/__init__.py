"""Tests of observers, progress, logging, metrics adapters."""
