"""elastic/driver/launch: worker output, its followers and its safety on a shared machine."""
