"""Liveness while the engine is busy: `GET /v2/health/live` latency during a long synthesis, against the
same probe on the same idle predictor (the baseline, measured first in the same run).

Synthesis runs on the engine thread, not the event loop, so a probe should wait for nothing but the
GIL, which the engine's C++ code releases. Probes go out one after another on a fresh connection
each (as the kubelet's do), every PROBE_EVERY_S, from the moment the long request is in flight until
its answer arrives. Every probe must answer 200 with a body; one that does not is a failed sample,
reported as such and left out of the figures.
"""

from __future__ import annotations

import threading
import time

import httpx

from bench.common import (
    SENTENCE,
    Predictor,
    Row,
    Session,
    SuiteResult,
    failed_sample,
    log,
    median,
    percentile,
)
from testing.bodies import v2_request

IDLE_N = 100
PROBE_EVERY_S = 0.02
LONG_TEXT = " ".join([SENTENCE] * 12)  # over a minute of engine time on a loaded 2-core CPU
GOAL_MS = 50.0  # a kubelet probe times out after 1 s by default; 50 ms leaves it far from that


def _probe(p: Predictor) -> tuple[float, str | None]:
    t = time.perf_counter()
    r = httpx.get(p.url + "/v2/health/live", timeout=5)
    return time.perf_counter() - t, failed_sample(r.status_code, len(r.content))


def _probes(p: Predictor, keep_going: threading.Event | None, n: int) -> tuple[list[float], list[str]]:
    ok: list[float] = []
    failed: list[str] = []
    while (keep_going is None and len(ok) + len(failed) < n) or (
        keep_going is not None and keep_going.is_set()
    ):
        seconds, why = _probe(p)
        if why is None:
            ok.append(seconds)
        else:
            failed.append(why)
        time.sleep(PROBE_EVERY_S)
    return ok, failed


def run(session: Session) -> SuiteResult:
    res = SuiteResult()
    p = Predictor(session, session.path("model-liveness"), ENGINE="torch")
    p.wait_ready(600)
    idle, idle_failed = _probes(p, None, IDLE_N)

    busy = threading.Event()
    busy.set()
    answer: dict[str, httpx.Response] = {}

    def synthesize() -> None:
        try:
            answer["r"] = httpx.post(p.url + "/v2/models/tts/infer", json=v2_request(LONG_TEXT), timeout=600)
        finally:
            busy.clear()

    worker = threading.Thread(target=synthesize)
    worker.start()
    p.wait_for(lambda: p.metric("tts_in_flight_requests") >= 1, 60, "the long request in flight", 0.01)
    during, during_failed = _probes(p, busy, 0)
    worker.join()
    synthesis_ok = "r" in answer and answer["r"].status_code == 200
    if not synthesis_ok:
        res.notes.append("the long synthesis failed: the busy figures were not measured under load")
    log(f"liveness: {len(idle)} idle probes, {len(during)} during a synthesis")

    idle_p50, during_p50 = median(idle) * 1e3, median(during) * 1e3
    during_p99, during_max = percentile(during, 99) * 1e3, max(during) * 1e3
    res.rows += [
        Row(
            "liveness",
            "probe p50 during a long synthesis",
            during_p50,
            "ms",
            "idle p50",
            idle_p50,
            during_p50 / idle_p50,
        ),
        Row(
            "liveness",
            "probe p99 during a long synthesis",
            during_p99,
            "ms",
            "idle p99",
            percentile(idle, 99) * 1e3,
            during_p99 / (percentile(idle, 99) * 1e3),
            goal=f"< {GOAL_MS:g} ms",
            met=synthesis_ok and during_p99 < GOAL_MS and not during_failed,
        ),
        Row(
            "liveness",
            "probe max during a long synthesis",
            during_max,
            "ms",
            "idle max",
            max(idle) * 1e3,
            during_max / (max(idle) * 1e3),
        ),
    ]
    res.details = {
        "probes_idle": len(idle),
        "probes_during": len(during),
        "failed_idle": idle_failed,
        "failed_during": during_failed,
        "synthesis_s": float(answer["r"].elapsed.total_seconds()) if synthesis_ok else None,
    }
    return res
