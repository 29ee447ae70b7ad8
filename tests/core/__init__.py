"""Tests of the kernel: the cleanup ledger, deliveries, with_cleanup, strategy leases."""
