"""The worker runtime: runs inside each training process started by `elasticrun`."""
