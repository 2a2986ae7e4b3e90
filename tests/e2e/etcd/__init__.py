"""The etcd backend with a real etcd: the driver's journal, a driver restart, TLS across it, the
operator commands through etcd."""
