"""Benchmarks run end to end at a tiny size."""
