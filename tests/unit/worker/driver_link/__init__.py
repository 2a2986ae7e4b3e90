"""elastic/worker/driver_link: the worker's side of the protocol (retries, clients)."""
