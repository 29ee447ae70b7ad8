"""Anthropic's Messages API: the strategy over the official ``anthropic`` SDK, its wire dialect and errors, and Message Batches."""
