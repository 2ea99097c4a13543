"""Shadow traffic: per-request records, their sinks, and `compare`, the canary verdict."""
