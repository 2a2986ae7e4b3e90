"""Horovod's API and elastic scenarios in real jobs under `elasticrun`."""
