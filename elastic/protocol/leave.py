"""The reasons a worker gives in a Leave call that are not a request to leave the job."""

EXITING = "exit"
"""The process exits after an error: its exit code says how it ended."""

FINISHED = "finished"
"""The user's script returned: this worker's part is done. Said at interpreter exit, with or
without `hvd.shutdown()` before, which alone says nothing (a later `hvd.init()` may follow)."""

EXIT_REASONS = frozenset({EXITING, FINISHED})
"""Either: the worker is exiting, so it is judged by its exit code, never by heartbeats."""
