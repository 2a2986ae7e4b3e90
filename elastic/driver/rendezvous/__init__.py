"""Rounds: the driver forms them, workers join them; slot assignment; the c10d key-value store."""
