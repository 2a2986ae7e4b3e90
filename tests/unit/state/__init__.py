"""elastic/state: checkpoints, durable commits, the elastic sampler."""
