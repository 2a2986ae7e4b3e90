"""Where the driver keeps job state: one interface, one module per backend."""
