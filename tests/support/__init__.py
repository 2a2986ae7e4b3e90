"""Helpers shared by the tests and the benchmarks: servers (etcd, sshd), running jobs, the worker
scripts, machine prerequisites. No tests here."""
