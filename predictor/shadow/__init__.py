"""Shadow traffic: per-request records and their sinks (the canary verdict, `tts-ops compare`, reads them)."""
