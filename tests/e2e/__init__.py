"""Tests of one behaviour through every surface, and crash trials that span the tree."""
