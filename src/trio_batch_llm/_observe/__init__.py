"""Observing a run: lifecycle events and hooks, metrics, progress."""
