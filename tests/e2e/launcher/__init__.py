"""`elasticrun` as a user runs it: exit codes, signals, output, the examples, `elastic.run_job`."""
