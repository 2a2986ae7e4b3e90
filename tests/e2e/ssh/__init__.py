"""Hosts reached through a real sshd on loopback."""
