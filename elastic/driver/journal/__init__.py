"""What outlives the driver: its claim on the job, the saved job state and result, and how a
restarted driver resumes; one interface, one module per backend."""
