"""The benchmark suite's pure parts and its catalogue (bench/)."""
