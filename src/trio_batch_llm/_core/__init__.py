"""The kernel: the cleanup ledger, cancellation deliveries, with_cleanup, strategy leases.

It imports nothing of the package but ``_values`` and ``_backends`` (a layout
test): the host, which owns admission and strategies, is built on it from
``_host``.
"""
