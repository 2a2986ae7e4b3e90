"""In-process tests, laid out like the package under `elastic/`: pure decisions and the servers on
loopback in this process. `pytest -m "not e2e"` runs them."""
