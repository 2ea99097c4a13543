"""Benchmarks for the TTS predictor: `python -m bench` (see bench/__main__.py)."""
