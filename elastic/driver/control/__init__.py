"""The gRPC control service: worker registration, heartbeats, leave requests, event streams."""
