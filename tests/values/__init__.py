"""Tests of values: config, results, errors, costs, tokens, requests."""
