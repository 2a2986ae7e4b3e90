"""What the driver decides, as pure functions of the job's state and the time: no I/O."""
