"""Tests of the response cache."""
