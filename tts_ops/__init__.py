"""The offline tools: `tts-ops` (compare, profile, simulate, manifests, image), run by people and CI.

They may import the runtime package (predictor); the runtime imports nothing from here, and the image
carries none of it (tests/unit/test_layout.py holds both). Dependencies: the `ops` extra.
"""
