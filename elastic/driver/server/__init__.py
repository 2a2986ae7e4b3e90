"""The driver's HTTP API: one router per resource, one schema per body, one auth check."""
