"""The tests' own helpers (tests/support)."""
