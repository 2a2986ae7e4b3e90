"""Horovod's `horovod.common` names that scripts import directly."""
