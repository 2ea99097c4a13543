"""tts-predictor: a scale-to-zero text-to-speech predictor for KServe."""

__version__ = "0.1.0"
