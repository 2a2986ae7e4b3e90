"""The worker runtime in real Gloo groups of forked processes (tests/support/worker_group.py),
without the launcher."""
