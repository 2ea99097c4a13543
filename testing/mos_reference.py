"""DNSMOS reference scores for tests/unit/test_quality.py, made by speechmos itself, and the clips they score.

`python -m testing.mos_reference` (`make mos-reference`) builds a virtualenv apart, .cache/dnsmos-venv,
with speechmos and librosa (speechmos's own code needs librosa, which our runtime neither needs nor
installs), scores the clips below there with `speechmos.dnsmos.run`, and writes
testing/dnsmos_reference.json: per clip its parameters, its length and level, the four scores, and the
versions that made them. The test takes its expected scores from that file and checks that the clips
it builds are the clips that were scored.

Only numpy is imported at the top: the same module runs inside that virtualenv (`--score`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
REFERENCE_FILE = Path(__file__).with_name("dnsmos_reference.json")
VENV = REPO / ".cache" / "dnsmos-venv"
# speechmos 0.0.1.1 is the wheel whose model files predictor/audio/quality.py loads; librosa 0.9.1 is
# the version its README names. requests: speechmos/dnsmos.py imports it at the top.
REQUIREMENTS = ["speechmos==0.0.1.1", "librosa==0.9.1", "onnxruntime", "requests"]
SR16 = 16000
SEGMENT_SECONDS = 9.01  # speechmos INPUT_LENGTH
# (seconds, seed, max_segments): max_segments 1 is the 12.5 s clip's first segment alone, which is
# what our estimator scores by default; speechmos scores all of a clip, so it is given that segment.
CLIPS = [(3.0, 1, None), (12.5, 2, None), (12.5, 2, 1)]


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """A fixed 16 kHz clip (harmonic glide, syllable envelope, a little noise): numpy's PCG64 stream
    is stable across versions, so the reference scores stay valid."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR16)) / SR16
    f0 = 110 + 40 * rng.random() + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR16
    tone = sum(np.sin(k * phase) / k for k in range(1, 20))
    envelope = np.sin(2 * np.pi * (2 + rng.random()) * t) ** 2
    noise = 0.01 * rng.standard_normal(len(t))
    return (0.15 * tone * envelope + noise).astype(np.float32)


def scored_clip(seconds: float, seed: int, max_segments: int | None) -> np.ndarray:
    """What speechmos is given for a CLIPS row."""
    x = speechlike(seconds, seed)
    if max_segments is None:
        return x
    if max_segments != 1:
        raise ValueError("only the first segment alone (max_segments 1) has a clip speechmos scores alike")
    return x[: int(SEGMENT_SECONDS * SR16)]


def describe(x: np.ndarray) -> dict[str, float | int]:
    """Length and level of a clip: what the test compares to tell the scored clip from a changed one."""
    x64 = x.astype(np.float64)
    return {
        "samples": len(x),
        "rms": float(np.sqrt(np.mean(x64**2))),
        "mean_abs": float(np.mean(np.abs(x64))),
    }


def load() -> dict:
    return json.loads(REFERENCE_FILE.read_text())


def scores() -> dict[tuple[float, int, int | None], tuple[float, float, float, float]]:
    """(seconds, seed, max_segments) -> (p808, sig, bak, ovrl), as the last run recorded them."""
    return {
        (c["seconds"], c["seed"], c["max_segments"]): (c["p808"], c["sig"], c["bak"], c["ovrl"])
        for c in load()["clips"]
    }


def _score_here() -> dict:
    """Inside the speechmos virtualenv: every CLIPS row through speechmos.dnsmos.run."""
    from importlib.metadata import version

    from speechmos import dnsmos

    clips = []
    for seconds, seed, max_segments in CLIPS:
        x = scored_clip(seconds, seed, max_segments)
        got = dnsmos.run(x, SR16)
        clips.append(
            {
                "seconds": seconds,
                "seed": seed,
                "max_segments": max_segments,
                **describe(x),
                "p808": float(got["p808_mos"]),
                "sig": float(got["sig_mos"]),
                "bak": float(got["bak_mos"]),
                "ovrl": float(got["ovrl_mos"]),
            }
        )
    names = ("speechmos", "librosa", "numpy", "onnxruntime")
    return {"versions": {n: version(n) for n in names}, "python": sys.version.split()[0], "clips": clips}


def _ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS], check=True)
    return python


def regenerate() -> dict:
    python = _ensure_venv()
    run = subprocess.run(
        [str(python), "-m", "testing.mos_reference", "--score"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise SystemExit(f"scoring in {VENV} failed:\n{run.stderr[-4000:]}")
    record = {
        "made_by": "python -m testing.mos_reference (make mos-reference)",
        "requirements": REQUIREMENTS,
        "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **json.loads(run.stdout),
    }
    part = REFERENCE_FILE.with_name(f".{REFERENCE_FILE.name}.part")
    part.write_text(json.dumps(record, indent=2) + "\n")
    part.replace(REFERENCE_FILE)  # a reader never sees half a file
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testing.mos_reference", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--score", action="store_true", help="score the clips here and print JSON (inside the venv)"
    )
    args = parser.parse_args(argv)
    if args.score:
        print(json.dumps(_score_here()))
        return 0
    record = regenerate()
    print(f"wrote {REFERENCE_FILE.relative_to(REPO)} ({record['versions']})")
    for c in record["clips"]:
        print(
            f"  {c['seconds']} s seed {c['seed']} segments {c['max_segments']}: p808 {c['p808']:.4f} ovrl {c['ovrl']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
