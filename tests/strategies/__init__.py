"""Tests of the provider strategies and their wire formats."""
