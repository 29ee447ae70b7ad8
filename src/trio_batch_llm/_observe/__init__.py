"""Observing a run: lifecycle events, hooks, metrics, progress and its displays."""
