"""Starting worker processes and reaching hosts: one launcher interface, a local and an ssh
implementation, host access, addresses, and the workers' output."""
