"""Liveness while the engine is busy: `GET /v2/health/live` latency during a long synthesis, against the
same probe on the same idle predictor (the baseline, measured first in the same run); and while
STALLED connections that never finish their request head are held open, more than MAX_CONNECTIONS
(serving/connections.py: the probes are answered past the limit, the stalled heads closed after
HEAD_TIMEOUT_S, which is set above the time this part takes).

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
from testing.load import largest_bodies
from testing.probes import http_probe, probes_from_another_process
from testing.slow_clients import stalled

IDLE_N = 100
PROBE_EVERY_S = 0.02
LONG_TEXT = " ".join([SENTENCE] * 12)  # over a minute of engine time on a loaded 2-core CPU
GOAL_MS = 50.0  # a kubelet probe times out after 1 s by default; 50 ms leaves it far from that
BODIES_GOAL_MS = 100.0  # issue 25's bound while the largest bodies the limits admit are read
PROBE_TIMEOUT_S = 1.0  # the kubelet's default timeoutSeconds, which the manifests keep
BODIES_S = 15.0
STALLED = 1500
MAX_CONNECTIONS = 1000  # the default; STALLED is over it
MAX_TEXT_CHARS = 5000  # the default: the many-texts body carries MAX_BATCH_ITEMS texts this long
STALLED_PROBES = 100


def _probe(p: Predictor) -> tuple[float, str | None]:
    try:
        seconds, status, body = http_probe(p.http_port, "/v2/health/live", timeout_s=PROBE_TIMEOUT_S)
    except (TimeoutError, OSError) as exc:
        return PROBE_TIMEOUT_S, f"{type(exc).__name__}: {exc}"
    return seconds, failed_sample(status, len(body))


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
    p = Predictor(
        session,
        session.path("model-liveness"),
        ENGINE="torch",
        MAX_CONNECTIONS=str(MAX_CONNECTIONS),
        HEAD_TIMEOUT_S="120",
    )
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
    bodies, bodies_failed, bodies_errors = _probes_while_bodies_are_read(p)
    log(f"liveness: {len(bodies)} probes while the largest bodies were read")
    bodies_p99 = percentile(bodies, 99) * 1e3 if bodies else float("nan")
    res.rows.append(
        Row(
            "liveness",
            "probe p99 while the largest admitted bodies arrive over REST and gRPC",
            bodies_p99,
            "ms",
            "idle p99",
            percentile(idle, 99) * 1e3,
            bodies_p99 / (percentile(idle, 99) * 1e3),
            goal=f"< {BODIES_GOAL_MS:g} ms",
            met=bool(bodies) and bodies_p99 < BODIES_GOAL_MS and not bodies_failed and not bodies_errors,
            note=f"max {max(bodies) * 1e3:.0f} ms over {len(bodies)} probes" if bodies else "",
        )
    )
    stalled, stalled_failed, opened = _probes_while_stalled(p)
    log(f"liveness: {len(stalled)} probes with {opened} stalled connections held")
    stalled_p99 = percentile(stalled, 99) * 1e3 if stalled else float("nan")
    res.rows.append(
        Row(
            "liveness",
            f"probe p99 with {STALLED} stalled connections (MAX_CONNECTIONS={MAX_CONNECTIONS})",
            stalled_p99,
            "ms",
            "idle p99",
            percentile(idle, 99) * 1e3,
            stalled_p99 / (percentile(idle, 99) * 1e3),
            goal=f"< {GOAL_MS:g} ms, none refused",
            met=bool(stalled) and stalled_p99 < GOAL_MS and not stalled_failed and opened == STALLED,
            note=f"{len(stalled_failed)} of {STALLED_PROBES} probes failed" if stalled_failed else "",
        )
    )
    res.details = {
        "failed_bodies": bodies_failed[:10],
        "body_sender_errors": bodies_errors[:10],
        "stalled_opened": opened,
        "failed_stalled": stalled_failed[:10],
        "probes_idle": len(idle),
        "probes_during": len(during),
        "failed_idle": idle_failed,
        "failed_during": during_failed,
        "synthesis_s": float(answer["r"].elapsed.total_seconds()) if synthesis_ok else None,
    }
    return res


def _probes_while_stalled(p: Predictor) -> tuple[list[float], list[str], int]:
    """Probe while STALLED connections hold half a request head each; (ok seconds, failures, opened)."""
    with stalled(p.http_port, STALLED) as held:
        opened = len(held)
        ok, failed = _probes(p, None, STALLED_PROBES)
    return ok, failed, opened


def _probes_while_bodies_are_read(p: Predictor) -> tuple[list[float], list[str], list[str]]:
    """Probe for BODIES_S while testing/load.largest_bodies keeps the predictor reading the largest
    bodies its limits admit; (ok seconds, failed probes, the senders' unexpected errors)."""
    with largest_bodies(p.url, p.grpc, max_text_chars=MAX_TEXT_CHARS) as errors:
        # From a process of its own: beside the senders' threads a probe would wait for their GIL.
        ok, failed = probes_from_another_process(
            p.http_port, "/v2/health/live", BODIES_S, PROBE_EVERY_S, PROBE_TIMEOUT_S
        )
    return ok, failed, list(errors)
