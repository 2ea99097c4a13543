"""Traffic: arrival times (seconds) and text lengths, from a CSV or a generator spec.

CSV: a header `t,chars`, then one request per line, times non-decreasing and >= 0. A locust
`--csv-full-history` file is not a request log, so replaying locust means exporting `t,chars` first.

Generator specs (`KIND:key=value,...`; seeds make them reproducible):
  poisson:rate=R,duration=S[,chars=N][,seed=K]          steady Poisson arrivals
  bursts:rate=R,on=S,off=S,duration=S[,chars=N][,seed=K]  Poisson during `on`, silence during `off`
  diurnal:peak=R,duration=S[,period=86400][,chars=N][,seed=K]  rate = peak x (1 - cos(2 pi t / period)) / 2
  idle:after=S[,count=1][,chars=N]                      `count` requests at once after S idle seconds
  closed:clients=N,duration=S[,think=S][,chars=N]       N callers in a loop from 0 s: each sends its next
                                                        request `think` s after its last one's answer
                                                        (200 or not), none after `duration`

A closed loop is what a load test's callers make (locust, test_scaling's threads): the load follows
the service, so waiting requests never outnumber the callers. Replayed open-loop at the times a real
system let them leave, it is exact only for a model exactly as fast as that system: a model a tenth
slower queues what the callers never sent.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tts_ops.simulate.errors import SimulateError

DEFAULT_CHARS = 120  # a two-sentence reply


@dataclass
class Trace:
    """Requests at `times` with `chars` each. With `clients` > 0 a closed loop: `times` are the callers'
    first sends, and each caller sends again (the same length) `think_s` after each answer until
    `until_s` (the simulator adds those requests as it runs)."""

    times: list[float]
    chars: list[int]
    source: str
    clients: int = 0
    think_s: float = 0.0
    until_s: float = math.inf

    def __len__(self) -> int:
        return len(self.times)


def load(spec: str) -> Trace:
    """A generator spec (contains ':' and names a known kind) or a CSV path."""
    kind = spec.split(":", 1)[0]
    if kind in GENERATORS and ":" in spec:
        return generate(spec)
    return load_csv(Path(spec))


def load_csv(path: Path) -> Trace:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise SimulateError(f"{path}: cannot read trace: {exc.strerror}") from None
    times: list[float] = []
    chars: list[int] = []
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != ["t", "chars"]:
            raise SimulateError(f"{path}:1: expected the header 't,chars', got {','.join(header or [])!r}")
        last = 0.0
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != 2:
                raise SimulateError(f"{path}:{line}: expected 2 columns (t,chars), got {len(row)}")
            try:
                t = float(row[0])
            except ValueError:
                raise SimulateError(f"{path}:{line}: column t is not a number: {row[0]!r}") from None
            try:
                n = int(row[1])
            except ValueError:
                raise SimulateError(f"{path}:{line}: column chars is not an integer: {row[1]!r}") from None
            if not math.isfinite(t) or t < 0:
                raise SimulateError(f"{path}:{line}: time {row[0]} is negative or not finite")
            if t < last:
                raise SimulateError(
                    f"{path}:{line}: time {t} is before the previous line's {last} (unsorted)"
                )
            if n < 1:
                raise SimulateError(f"{path}:{line}: chars must be >= 1, got {n}")
            times.append(t)
            chars.append(n)
            last = t
    return Trace(times, chars, str(path))


def _params(spec: str, allowed: dict[str, float], required: set[str]) -> dict[str, float]:
    kind, _, rest = spec.partition(":")
    values = dict(allowed)
    for item in filter(None, rest.split(",")):
        key, eq, raw = item.partition("=")
        if not eq or key not in allowed:
            raise SimulateError(
                f"trace {spec!r}: unknown parameter {key!r} for {kind} (expected {', '.join(sorted(allowed))})"
            )
        try:
            values[key] = float(raw)
        except ValueError:
            raise SimulateError(f"trace {spec!r}: {key}={raw!r} is not a number") from None
        if values[key] < 0:
            raise SimulateError(f"trace {spec!r}: {key} must be >= 0")
    missing = required - {item.partition("=")[0] for item in rest.split(",")}
    if missing:
        raise SimulateError(f"trace {spec!r}: missing {', '.join(sorted(missing))}")
    return values


def _poisson(
    rng: random.Random,
    rate_at: Callable[[float], float] | None,
    peak: float,
    start: float,
    end: float,
    out: list[float],
) -> None:
    """Thinning (Lewis-Shedler): candidate arrivals at the peak rate, kept with probability rate/peak."""
    if peak <= 0:
        return
    t = start
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return
        if rate_at is None or rng.random() * peak < rate_at(t):
            out.append(t)


def generate(spec: str) -> Trace:
    kind = spec.split(":", 1)[0]
    times: list[float] = []
    if kind == "poisson":
        p = _params(spec, {"rate": 1, "duration": 3600, "chars": DEFAULT_CHARS, "seed": 1}, {"rate"})
        _poisson(random.Random(p["seed"]), None, p["rate"], 0.0, p["duration"], times)
    elif kind == "bursts":
        p = _params(
            spec,
            {"rate": 5, "on": 60, "off": 600, "duration": 3600, "chars": DEFAULT_CHARS, "seed": 1},
            {"rate"},
        )
        rng = random.Random(p["seed"])
        start = 0.0
        while start < p["duration"]:
            _poisson(rng, None, p["rate"], start, min(start + p["on"], p["duration"]), times)
            start += p["on"] + p["off"]
    elif kind == "diurnal":
        p = _params(
            spec, {"peak": 1, "duration": 86400, "period": 86400, "chars": DEFAULT_CHARS, "seed": 1}, {"peak"}
        )
        peak, period = p["peak"], p["period"]
        _poisson(
            random.Random(p["seed"]),
            lambda t: peak * (1 - math.cos(2 * math.pi * t / period)) / 2,
            peak,
            0.0,
            p["duration"],
            times,
        )
    elif kind == "idle":
        p = _params(spec, {"after": 3600, "count": 1, "chars": DEFAULT_CHARS}, {"after"})
        times = [p["after"]] * int(p["count"])
    elif kind == "closed":
        p = _params(spec, {"clients": 1, "duration": 60, "think": 0, "chars": DEFAULT_CHARS}, {"clients"})
        clients = int(p["clients"])
        if clients < 1 or clients != p["clients"]:
            raise SimulateError(f"trace {spec!r}: clients must be a whole number >= 1")
        return Trace([0.0] * clients, [int(p["chars"])] * clients, spec, clients, p["think"], p["duration"])
    else:
        raise SimulateError(f"trace {spec!r}: unknown generator {kind!r} (expected {', '.join(GENERATORS)})")
    return Trace(times, [int(p["chars"])] * len(times), spec)


GENERATORS = ("poisson", "bursts", "diurnal", "idle", "closed")
