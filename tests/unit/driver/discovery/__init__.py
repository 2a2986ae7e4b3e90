"""elastic/driver/discovery: host lists, discovery scripts, cooldown, the host watcher."""
