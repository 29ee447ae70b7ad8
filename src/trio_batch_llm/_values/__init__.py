"""Values: errors, configuration, results and counters. No awaits, no runtime."""
