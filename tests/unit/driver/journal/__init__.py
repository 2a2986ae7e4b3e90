"""elastic/driver/journal: what a driver saves and a restarted one reads back; etcd trust."""
