"""The engine: processor, workers, stops, publishing, the item path, the pool, entry points."""
