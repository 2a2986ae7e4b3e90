"""The wire contract between driver and workers: environment variables and HTTP schemas."""
