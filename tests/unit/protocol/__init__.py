"""elastic/protocol: what driver and worker agree on (heartbeat frames, the worker's
environment)."""
