"""What outlives the driver: its claim on the job, the job's saved state, and its result.

A driver claims its job in a `StateBackend` (`backend.py`: the interface; `memory.py`, the
default, lost with the driver; `etcd.py`, which outlives it): at most one driver holds a job.
While it runs, the `JobJournal` (`journal.py`) saves the job's documents (`record.py`) in the
background (`saver.py`); a driver started again with the same job id checks them against the
job's token (`job_token.py`) and takes the job up where its predecessor left it (`resume.py`),
re-adopting the workers that kept training.
"""
