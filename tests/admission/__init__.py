"""Tests of the admission layer: quota scopes, pacing, discovery, shared quotas in Redis."""
