"""Tests of the engine: processor, workers, stops, the item path, breakers, the pool."""
