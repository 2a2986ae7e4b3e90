"""elastic/driver/cli: the launcher's flags and the operator commands."""
