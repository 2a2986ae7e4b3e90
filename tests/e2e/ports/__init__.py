"""The driver's heartbeat and gRPC ports against hostile peers in processes of their own."""
