"""Anthropic's Messages API: the strategy over the ``anthropic`` SDK, its wire dialect and errors, batches."""
