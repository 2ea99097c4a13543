"""The predictor's measured costs: synthesis time against text length, and cold start.

A profile is JSON (schema below). `measure(url)` makes one from a running predictor: it times real v2
requests of several lengths (one at a time, each after a pause, so a time is one synthesis on an idle
predictor plus the HTTP hop), takes the mean of each length's repeats and fits seconds = base_s +
per_char_s x characters by least squares; a run of calls back to back gives back_to_back_factor;
cold start phases come from the predictor's own `tts_cold_start_seconds` gauges, the engine from its
v2 model metadata (`platform`).
The 1-minute load average is read before the first request and after the last: `admit` refuses a
profile measured with it above the machine's cores (a shared machine's times, not the predictor's)
unless forced, and a forced profile says so. `shipped` is the profile `simulate` uses for an engine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tts_ops.simulate.errors import SimulateError

if TYPE_CHECKING:
    import httpx

SCHEMA = "tts-predictor-profile/1"
# Lengths measured by `profile`: a short reply up to a paragraph (MAX_SEGMENT_CHARS-sized).
LENGTHS = (20, 80, 200, 400)
# Requests sent at once for overlap_factor: the CPU manifests' two engine workers; of one length.
OVERLAP = 2
OVERLAP_CHARS = 200
# The pause before each timed repeat: a half-core pod's call after 0.3 s idle took 0.50 s, after
# 0.6 s 0.48 s, after 1 s 0.47 s (means of 15); back to back 0.57-0.63 s.
IDLE_GAP_S = 1.0
# A call starting this soon after the pod's last one ended is back to back: a call after a 0.1 s
# pause took 0.60 s on that pod (as back to back), after 0.3 s 0.50 s (nearly as after idle); halfway.
BACK_TO_BACK_S = 0.2
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
    points: tuple[tuple[int, float], ...] = ()  # (characters, seconds: the repeats' `average`) of the fit
    load_average: tuple[float, ...] = ()  # 1-minute load average at the start and at the end; () unknown
    cores: int = 0  # the measuring machine's CPUs (os.cpu_count); 0 unknown
    forced: bool = False  # written with `profile --force` although load_average was above cores
    # A call's time while OVERLAP calls run at once on the predictor, over its time alone: the
    # makespan of OVERLAP simultaneous requests of OVERLAP_CHARS / one alone. 0: not measured, and a
    # simulated pod runs one call at a time whatever its ENGINE_WORKERS.
    overlap_factor: float = 0.0
    # Of a length's repeats, the points give their mean: a pod drains its queue at one request per mean
    # time, and a CPU-limited pod's times have a long tail (half a core: median 0.54 s, mean 0.60 s
    # over 25 of one sentence). Profiles written before say "median".
    average: str = "median"
    # A call's time when it starts within BACK_TO_BACK_S of the pod's last call ending, over its time
    # after the pod was idle (the points, each repeat IDLE_GAP_S after the last). A pod under a CPU
    # limit starts a call after idle with its quota unspent: the e2e sentence on a half-core pod took
    # 0.47 s after a second's pause and 0.57-0.63 s back to back. 0: not measured (1).
    back_to_back_factor: float = 0.0

    def back_to_back_s(self, chars: int) -> float:
        """A call's time right after another on its pod."""
        return self.synthesis_s(chars) * (self.back_to_back_factor or 1.0)

    def overlapping_s(self, chars: int) -> float:
        """A call's time beside another on a pod of several engine workers."""
        return self.synthesis_s(chars) * self.overlap_factor

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
    "load_average": list,
    "cores": int,
    "forced": bool,
    "overlap_factor": (int, float),
    "average": str,
    "back_to_back_factor": (int, float),
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
    for key in ("base_s", "per_char_s", "cold_start_s", "overlap_factor", "back_to_back_factor"):
        if doc.get(key, 0) < 0:
            raise SimulateError(f"{path}: key {key!r} must be >= 0, got {doc[key]}")
    if doc.get("average", "median") not in ("mean", "median"):
        raise SimulateError(f"{path}: key 'average' is {doc['average']!r}, expected 'mean' or 'median'")
    phases = doc.get("phases_s", {})
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in phases.values()):
        raise SimulateError(f"{path}: key 'phases_s' must map phase names to seconds")
    loads = doc.get("load_average", [])
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in loads):
        raise SimulateError(f"{path}: key 'load_average' must list load averages (start, end)")
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
        load_average=tuple(float(v) for v in loads),
        cores=doc.get("cores", 0),
        forced=doc.get("forced", False),
        overlap_factor=float(doc.get("overlap_factor", 0.0)),
        average=doc.get("average", "median"),
        back_to_back_factor=float(doc.get("back_to_back_factor", 0.0)),
    )


SHIPPED_DIR = Path(__file__).parent / "profiles"
# The shipped profile for each (engine, device) a predictor runs; each file's own engine and device
# say the same (tests/unit/test_simulate_profiles.py). onnx on cuda has none: nothing here measured it.
SHIPPED = {
    ("onnx", "cpu"): "cpu-2core-onnx.json",
    ("torch", "cpu"): "cpu-2core.json",
    ("torch", "cuda"): "gpu-assumed.json",
}


def shipped(engine: str, device: str, where: str) -> Path:
    """The shipped profile of ENGINE on DEVICE (cpu or cuda); an engine without one is an error that
    says how to make one."""
    name = SHIPPED.get((engine, device))
    if name is None:
        have = ", ".join(f"{e} on {d}" for e, d in SHIPPED)
        raise SimulateError(
            f"{where}: the predictor runs engine {engine} on {device} and no shipped profile measures it "
            f"(shipped: {have}); measure one with `tts-ops profile --url ... --out FILE` on a predictor "
            "running it and pass --profile FILE"
        )
    return SHIPPED_DIR / name


def choose(given: str | Path | None, engine: str, device: str, why: str, where: str) -> tuple[Path, str]:
    """The profile `simulate` runs with and why: GIVEN (--profile) if any, else the shipped profile
    of the engine the simulated predictor runs (WHY: the env that chose it)."""
    if given:
        return Path(given), "given by --profile"
    return shipped(engine, device, where), f"the shipped profile of {engine} on {device}: {why}"


def warnings(profile: Profile, engine: str, device: str) -> list[str]:
    """What a reader of the simulation must know about its profile: forced past the load guard,
    or measured on another engine or device than the simulated predictor runs."""
    found = []
    if profile.forced:
        found.append(
            f"the profile was written with --force: {load_problem(profile) or 'measured on a busy machine'}; "
            "its times include that machine's contention"
        )
    if (profile.engine, profile.device) != (engine, device):
        found.append(
            f"the profile was measured on {profile.engine} on {profile.device}, the simulated predictor "
            f"runs {engine} on {device}"
        )
    return found


def load_problem(profile: Profile) -> str | None:
    """Why the machine that measured PROFILE was too busy to trust its times: the 1-minute load
    average above its cores at the start or the end. None when it was not, or nothing was recorded."""
    if not profile.load_average or profile.cores <= 0:
        return None
    if max(profile.load_average) <= profile.cores:
        return None
    start, end = profile.load_average[0], profile.load_average[-1]
    return (
        f"the 1-minute load average was {start:.2f} at the start and {end:.2f} at the end of the "
        f"measurement, above the machine's {profile.cores} cores"
    )


def admit(profile: Profile, force: bool = False) -> Profile:
    """PROFILE if it was measured on a quiet machine; with FORCE, a loaded one marked forced;
    otherwise SimulateError naming the load and the cores."""
    problem = load_problem(profile)
    if problem is None:
        return profile
    if not force:
        raise SimulateError(
            f"not writing the profile: {problem}, so its times are the machine's contention, not the "
            "predictor's; measure again on a quiet machine, or pass --force to keep it marked forced"
        )
    return dataclasses.replace(profile, forced=True)


def one_minute_load() -> float:
    return os.getloadavg()[0]


def reported_engine(meta: Any) -> str | None:
    """The engine a predictor names in its v2 model metadata (`platform`: onnx or torch), or None."""
    from predictor.config import Settings

    engines = set(typing.get_args(Settings.model_fields["engine"].annotation)) - {"auto"}
    platform = meta.get("platform") if isinstance(meta, dict) else None
    return platform if platform in engines else None


def fit_linear(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (base, slope) of seconds against characters; both clamped at >= 0."""
    xs, ys = [float(p[0]) for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    slope = max(slope, 0.0)
    return max(my - slope * mx, 0.0), slope


def measure(
    url: str,
    repeats: int = 3,
    model: str = "tts",
    lengths: tuple[int, ...] = LENGTHS,
    *,
    engine: str | None = None,
    device: str = "cpu",
    load_average: Callable[[], float] = one_minute_load,
    cores: int | None = None,
    transport: httpx.BaseTransport | None = None,
    overlap: int = OVERLAP,
    idle_gap_s: float = IDLE_GAP_S,
    mos_sample: float = 0.0,
) -> Profile:
    """Time real requests against a ready predictor at `url` and read its cold-start gauges.

    The engine is the one the predictor reports; ENGINE is for a predictor that reports none, and
    must agree with one that does. DEVICE (cpu or cuda) is not reported: it is the caller's word.
    OVERLAP requests of OVERLAP_CHARS sent at once, REPEATS times, give overlap_factor (0: not measured):
    what a call costs beside others on this predictor as it runs (its ENGINE_WORKERS and CPUs).
    Each timed repeat waits IDLE_GAP_S first (the points are calls after idle); REPEATS calls of the
    first length back to back then give back_to_back_factor.
    MOS_SAMPLE is the predictor's SHADOW_MOS_SAMPLE where it records shadow traffic: each call carries
    an x-request-id, none of the calls after a pause is in the MOS sample and round(MOS_SAMPLE x
    REPEATS) of the back-to-back calls are, spread evenly, so the back-to-back time carries the share
    of DNSMOS work every busy pod pays, not a draw of it (a scored call costs a half-core pod about
    0.75 s over the calls after it: twenty unscored calls 1.30 times one after a pause, one scored 1.39).
    LOAD_AVERAGE, CORES and TRANSPORT are seams for tests (the machine's load, os.cpu_count(), HTTP)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    url = url.rstrip("/")
    if not 0 <= mos_sample <= 1:
        raise SimulateError(f"mos_sample {mos_sample}: a share of requests, from 0 to 1")
    cores = (os.cpu_count() or 0) if cores is None else cores
    load_start = load_average()
    with httpx.Client(timeout=120, transport=transport) as client:
        ready = client.get(f"{url}/v2/models/{model}/ready")
        if ready.status_code != 200:
            raise SimulateError(f"{url}: model {model!r} is not ready (HTTP {ready.status_code})")
        meta = client.get(f"{url}/v2/models/{model}").json()
        reported = reported_engine(meta)
        if reported is None and engine is None:
            raise SimulateError(
                f"{url}/v2/models/{model}: the metadata names no engine (platform onnx or torch); "
                "pass --engine"
            )
        if reported is not None and engine is not None and reported != engine:
            raise SimulateError(f"--engine {engine}: the predictor at {url} reports engine {reported}")

        ids = _RequestIds(mos_sample)

        def infer(n: int, scored: bool = False) -> float:
            """Seconds of one v2 request of n characters; SCORED: its id is in the MOS sample."""
            text = _text(n)
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
            t0 = time.perf_counter()
            r = client.post(
                f"{url}/v2/models/{model}/infer", json=body, headers={"x-request-id": ids.next(scored)}
            )
            if r.status_code != 200:
                raise SimulateError(f"{url}: infer answered {r.status_code}: {r.text[:200]}")
            return time.perf_counter() - t0

        def after_idle(n: int) -> float:
            time.sleep(idle_gap_s)
            return infer(n)

        points = [(len(_text(n)), statistics.mean(after_idle(n) for _ in range(repeats))) for n in lengths]
        # Back to back, after one call of that length that is not counted (it follows another length).
        infer(lengths[0])
        scored = _spread(round(mos_sample * repeats), repeats)
        back_to_back = [infer(lengths[0], i in scored) for i in range(repeats)]
        back_to_back_factor = round(statistics.mean(back_to_back) / points[0][1], 3) if points[0][1] else 0.0
        overlap_factor = 0.0
        if overlap > 1:
            from concurrent.futures import ThreadPoolExecutor

            # One alone, then OVERLAP at once, in turn: a drift of the machine's speed moves both.
            alone, makespans = [], []
            with ThreadPoolExecutor(overlap) as pool:
                for _ in range(repeats):
                    alone.append(infer(OVERLAP_CHARS))
                    t0 = time.perf_counter()
                    list(pool.map(infer, [OVERLAP_CHARS] * overlap))
                    makespans.append(time.perf_counter() - t0)
            overlap_factor = round(statistics.median(makespans) / statistics.median(alone), 3)
        phases: dict[str, float] = {}
        for family in text_string_to_metric_families(client.get(f"{url}/metrics").text):
            for sample in family.samples:
                if sample.name == "tts_cold_start_seconds":
                    phases[sample.labels["phase"]] = sample.value
    load_end = load_average()
    if "total" not in phases:
        raise SimulateError(f'{url}/metrics has no tts_cold_start_seconds{{phase="total"}}')
    base, slope = fit_linear(points)
    return Profile(
        base_s=round(base, 5),
        per_char_s=round(slope, 7),
        cold_start_s=round(phases.pop("total"), 3),
        phases_s={k: round(v, 3) for k, v in sorted(phases.items())},
        engine=reported or str(engine),
        device=device,
        measured_on=(
            f"{os.uname().nodename}, {cores} CPUs, load average {load_start:.1f} -> {load_end:.1f}, "
            f"{time.strftime('%Y-%m-%d')}"
        ),
        points=tuple((n, round(t, 4)) for n, t in points),
        load_average=(round(load_start, 2), round(load_end, 2)),
        cores=cores,
        overlap_factor=overlap_factor,
        average="mean",
        back_to_back_factor=back_to_back_factor,
    )


class _RequestIds:
    """Request ids in or out of a predictor's MOS sample (predictor.shadow.recorder.mos_sampled: a
    hash of the id, so whether an id is scored is known before it is sent)."""

    def __init__(self, share: float) -> None:
        self.share, self._n = share, 0

    def next(self, scored: bool) -> str:
        from predictor.shadow.recorder import mos_sampled

        if scored and self.share <= 0:
            raise ValueError("no id is scored at a MOS share of 0")
        while True:
            self._n += 1
            rid = f"profile-{os.getpid()}-{self._n}"
            if self.share >= 1 or mos_sampled(rid, self.share) == scored:  # at 1, every id is scored
                return rid


def _spread(k: int, n: int) -> set[int]:
    """K of the positions 0..N-1, evenly apart (the middle of each of K equal parts)."""
    return {int((j + 0.5) * n / k) for j in range(k)} if k > 0 else set()


def _text(n: int) -> str:
    """About n characters of plain sentences."""
    return (_SENTENCE * (n // len(_SENTENCE) + 1))[:n].strip()


def write(profile: Profile, out: Path) -> None:
    """Atomically: a reader never sees half a profile. With the umask's mode (mkstemp's 0600 made a
    shipped profile unreadable to anyone but its writer)."""
    from predictor.storage.files import atomic_write_bytes

    atomic_write_bytes(Path(out), (json.dumps(profile.to_json(), indent=2) + "\n").encode())
