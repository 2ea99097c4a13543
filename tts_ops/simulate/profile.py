"""The predictor's measured costs: synthesis time against text length, and cold start.

A profile is JSON (schema below). `measure(url)` makes one from a running predictor: it times real v2
requests of several lengths (sequentially, so a time is one synthesis plus the HTTP hop) and fits
seconds = base_s + per_char_s x characters by least squares; cold start phases come from the
predictor's own `tts_cold_start_seconds` gauges.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tts_ops.simulate.errors import SimulateError

SCHEMA = "tts-predictor-profile/1"
# Lengths measured by `profile`: a short reply up to a paragraph (MAX_SEGMENT_CHARS-sized).
LENGTHS = (20, 80, 200, 400)
_SENTENCE = "The quick brown fox jumps over the lazy dog while the band plays on. "


@dataclass(frozen=True)
class Profile:
    base_s: float  # seconds per request independent of length (HTTP, phonemes, model call)
    per_char_s: float  # seconds per input character
    cold_start_s: float  # process exec -> ready (tts_cold_start_seconds{phase="total"})
    phases_s: dict[str, float]  # fetch, load, warmup
    engine: str = "unknown"
    device: str = "cpu"
    measured_on: str = ""
    assumed: bool = False  # true for a profile written by hand (e.g. a GPU shape), not measured
    points: tuple[tuple[int, float], ...] = ()  # (characters, median seconds) behind the fit

    def synthesis_s(self, chars: int) -> float:
        return self.base_s + self.per_char_s * chars

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "base_s": (int, float),
    "per_char_s": (int, float),
    "cold_start_s": (int, float),
    "phases_s": dict,
    "engine": str,
    "device": str,
    "measured_on": str,
    "assumed": bool,
    "points": list,
}


def load(path: Path | str) -> Profile:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise SimulateError(f"{path}: cannot read profile: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SimulateError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise SimulateError(f"{path}: a profile is a JSON object")
    for key in doc:
        if key not in _FIELDS:
            raise SimulateError(f"{path}: unknown key {key!r} (expected {', '.join(_FIELDS)})")
    for key in ("schema", "base_s", "per_char_s", "cold_start_s"):
        if key not in doc:
            raise SimulateError(f"{path}: missing key {key!r}")
    if doc["schema"] != SCHEMA:
        raise SimulateError(f"{path}: key 'schema' is {doc['schema']!r}, expected {SCHEMA!r}")
    for key, kind in _FIELDS.items():
        if key in doc and (
            not isinstance(doc[key], kind) or (kind is not bool and isinstance(doc[key], bool))
        ):
            raise SimulateError(f"{path}: key {key!r} has the wrong type ({type(doc[key]).__name__})")
    for key in ("base_s", "per_char_s", "cold_start_s"):
        if doc[key] < 0:
            raise SimulateError(f"{path}: key {key!r} must be >= 0, got {doc[key]}")
    phases = doc.get("phases_s", {})
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in phases.values()):
        raise SimulateError(f"{path}: key 'phases_s' must map phase names to seconds")
    return Profile(
        base_s=float(doc["base_s"]),
        per_char_s=float(doc["per_char_s"]),
        cold_start_s=float(doc["cold_start_s"]),
        phases_s={k: float(v) for k, v in phases.items()},
        engine=doc.get("engine", "unknown"),
        device=doc.get("device", "cpu"),
        measured_on=doc.get("measured_on", ""),
        assumed=doc.get("assumed", False),
        points=tuple((int(c), float(t)) for c, t in doc.get("points", [])),
    )


def default_path() -> Path:
    return Path(__file__).parent / "profiles" / "cpu-2core.json"


def fit_linear(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (base, slope) of seconds against characters; both clamped at >= 0."""
    xs, ys = [float(p[0]) for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    slope = max(slope, 0.0)
    return max(my - slope * mx, 0.0), slope


def measure(url: str, repeats: int = 3, model: str = "tts", lengths: tuple[int, ...] = LENGTHS) -> Profile:
    """Time real requests against a ready predictor at `url` and read its cold-start gauges."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    url = url.rstrip("/")
    with httpx.Client(timeout=120) as client:
        ready = client.get(f"{url}/v2/models/{model}/ready")
        if ready.status_code != 200:
            raise SimulateError(f"{url}: model {model!r} is not ready (HTTP {ready.status_code})")
        meta = client.get(f"{url}/v2/models/{model}").json()
        points: list[tuple[int, float]] = []
        for n in lengths:
            text = (_SENTENCE * (n // len(_SENTENCE) + 1))[:n].strip()
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = client.post(f"{url}/v2/models/{model}/infer", json=body)
                times.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    raise SimulateError(f"{url}: infer answered {r.status_code}: {r.text[:200]}")
            points.append((len(text), statistics.median(times)))
        phases: dict[str, float] = {}
        for family in text_string_to_metric_families(client.get(f"{url}/metrics").text):
            for sample in family.samples:
                if sample.name == "tts_cold_start_seconds":
                    phases[sample.labels["phase"]] = sample.value
    if "total" not in phases:
        raise SimulateError(f'{url}/metrics has no tts_cold_start_seconds{{phase="total"}}')
    base, slope = fit_linear(points)
    params = meta.get("parameters", {}) if isinstance(meta, dict) else {}
    return Profile(
        base_s=round(base, 5),
        per_char_s=round(slope, 7),
        cold_start_s=round(phases.pop("total"), 3),
        phases_s={k: round(v, 3) for k, v in sorted(phases.items())},
        engine=str(params.get("engine", "unknown")),
        device=str(params.get("device", "cpu")),
        measured_on=(
            f"{os.uname().nodename}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
            f"{time.strftime('%Y-%m-%d')}"
        ),
        points=tuple((n, round(t, 4)) for n, t in points),
    )


def write(profile: Profile, out: Path) -> None:
    """Atomically: a reader never sees half a profile."""
    out = Path(out)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent or ".")
    with os.fdopen(fd, "w") as f:
        json.dump(profile.to_json(), f, indent=2)
        f.write("\n")
    os.replace(tmp, out)
