"""The harness that tests/, bench/ and `make run` share: free ports, polling, child processes, a local
S3 (moto) with the default voice, the predictor as a real process, and request bodies.

Development only: pyproject's package list names predictor* and tts_ops* and the Dockerfile copies
only predictor/, so none of this reaches a serving image. Imported from the repository root
(`python -m pytest`, `python -m bench`, `python -m testing.local` all put it on sys.path).
"""
