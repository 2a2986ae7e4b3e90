"""The driver (elastic/driver/), one folder per sub-package."""
