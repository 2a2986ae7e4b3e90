"""elastic/driver/observe: rates, timeline, stalls, metrics."""
