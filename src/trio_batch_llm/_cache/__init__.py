"""The response cache's runtime: request keys, connections to each backend, single flight."""
