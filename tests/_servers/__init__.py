"""Real servers the test session starts on loopback (one module per server)."""
