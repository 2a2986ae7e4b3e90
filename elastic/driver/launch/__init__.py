"""Starting worker processes: one interface, a local and an ssh implementation."""
