"""The kernel: the host and its runtime tasks, the cleanup ledger, deliveries, leases."""
