"""elastic/driver/control: the gRPC control service, channels, liveness watch, heartbeats'
inputs."""
