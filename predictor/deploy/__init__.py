"""Rendering our own kustomize tree; used by tools and by `tts-predictor simulate`."""
