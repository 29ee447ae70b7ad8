"""Strategies: the protocol, adapters for callables, the scripted fake, and providers."""
