"""What an operator sees of a running job: workers' progress, the rounds timeline, stalls,
the driver's own health, and the Prometheus metrics built from them."""
