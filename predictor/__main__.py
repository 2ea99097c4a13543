"""`python -m predictor`: the same entry point as the `tts-predictor` console script."""

from predictor.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
