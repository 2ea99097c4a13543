"""Shadow records for `compare`: speech-like synthetic audio and the record a predictor would write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

SR = 22050


def voiced(seed: int, seconds: float = 1.5) -> np.ndarray:
    """Speech-like test audio: a gliding harmonic tone with a syllable-rate envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    f0 = 110 + 40 * rng.random() + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    tone = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * (3 + rng.random()) * t) ** 2
    return (0.2 * tone * envelope).astype(np.float32)


def shadow_record(
    rid: str,
    revision: str,
    audio: np.ndarray,
    *,
    latency_s: float = 0.5,
    status: int = 200,
    mos: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The record a predictor's recorder writes for one v2 request that answered ``audio``; ``mos``
    ({"p808": …, "ovrl": …, …}) fills its mos_* fields, as for a request SHADOW_MOS_SAMPLE picked."""
    from predictor.audio import fingerprint
    from predictor.shadow import recorder

    ok = status < 400
    return {
        "v": 1,
        "id": rid,
        "revision": revision,
        "route": "/v2/models/{model_name}/infer",
        "status": status,
        "ts": 1.0,
        "latency_s": latency_s,
        "audio_s": len(audio) / SR if ok else None,
        "sample_rate": SR if ok else None,
        "items": 1,
        "text_sha256": recorder.text_sha256([rid]),
        "mcep": fingerprint.fingerprint(audio, SR).tolist() if ok else None,
        **{f: (mos or {}).get(f.removeprefix("mos_")) for f in recorder.MOS_FIELDS},
    }


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
