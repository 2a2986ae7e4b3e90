"""elastic/driver/policy: the re-forming policy's pure decisions."""
