"""Audio: encoders for every output format, resampling, crossfading segments, fingerprints."""
