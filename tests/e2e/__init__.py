"""Real-process tests: `elasticrun` jobs, worker process groups, peers in processes of their own,
sshd, etcd, a browser. Every test here is marked `e2e` (tests/conftest.py)."""
