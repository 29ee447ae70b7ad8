"""Where a durable run's state lives: the repository protocol's implementations."""
