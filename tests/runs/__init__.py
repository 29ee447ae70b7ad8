"""Tests of durable runs: drivers, repositories, leases."""
