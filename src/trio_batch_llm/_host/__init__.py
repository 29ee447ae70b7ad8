"""The host: one task group with its quota scopes, strategy leases and cleanup ledger, built on the kernel.

``ExecutorHost`` owns admission and strategies, so it stands above ``_core``
(the kernel imports neither); processors and pools in ``_engine`` build on it.
"""
