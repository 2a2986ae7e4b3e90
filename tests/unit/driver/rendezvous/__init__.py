"""elastic/driver/rendezvous: slot assignment and round batching."""
