"""Wakes from zero timed step by step, for the simulator's pod start (tts_ops/simulate/pods.py): the
kubelet's own log at -v=2 (microseconds) against the request's send and the predictor's "model ready"
line, where the API's timestamps have whole seconds (tests/e2e/test_simulator.py,
test_knative_simulator.py; docs/cluster.md "A pod's start, step by step")."""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testing.kube import NAMESPACE, SENTENCE, Cluster, at_zero, eventually, stable_pods, timestamp
from testing.prediction import simulate_overlay

NODE = "ttsk8s-node"  # cluster/node.py NODE_NAME
_KLOG = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)")


@contextlib.contextmanager
def kubelet_verbosity(cluster: Cluster, level: int) -> Iterator[None]:
    """The kubelet's log verbosity set through its debug handler (PUT /debug/flags/v, reached
    through the API server's node proxy), back to 0 afterwards: at 2 it logs each pod's sync-loop
    events and probe results with their times."""

    def put(value: int) -> None:
        out = cluster.kubectl(
            "replace", "--raw", f"/api/v1/nodes/{NODE}/proxy/debug/flags/v", "-f", "-", input_text=str(value)
        )
        assert out.returncode == 0, out.stderr

    put(level)
    try:
        yield
    finally:
        put(0)


def _klog_time(line: str, year: int) -> float | None:
    found = _KLOG.match(line)
    if found is None:
        return None
    month, day, clock = found.groups()
    return datetime.fromisoformat(f"{year}-{month}-{day}T{clock}").replace(tzinfo=UTC).timestamp()


def kubelet_steps(log: Path, pod: str, since: float) -> dict[str, float | None]:
    """Absolute times of a pod's steps in the kubelet's log (-v=2): the pod added to the sync loop,
    its startup probe's first pass and the first passing readiness probe (None where not logged)."""
    year = datetime.fromtimestamp(since, UTC).year
    marks = {
        "kubelet_add": "SyncLoop ADD",
        "startup_passed": 'probe="startup" status="started"',
        "readiness_passed": 'probe="readiness" status="ready"',
    }
    found: dict[str, float | None] = dict.fromkeys(marks)
    with log.open(errors="replace") as lines:
        for line in lines:
            if pod not in line:
                continue
            for step, mark in marks.items():
                if found[step] is None and mark in line:
                    at = _klog_time(line, year)
                    found[step] = at if at is not None and at >= since - 1 else None
    return found


def keda_scaled_from_zero(log: Path, since: float) -> float | None:
    """When the KEDA operator first scaled a target from zero at or after `since` (its log's
    "Successfully updated ScaleTarget" from 0 replicas; cluster/platform.py has it write times
    in nanoseconds), or None."""
    with log.open(errors="replace") as lines:
        for line in lines:
            if '"Successfully updated ScaleTarget"' not in line:
                continue
            entry = json.loads(line)
            if entry.get("Original Replicas Count") != 0:
                continue
            # RFC 3339 with nanoseconds: Python's parser takes microseconds.
            whole, _, fraction = entry["ts"].rstrip("Z").partition(".")
            at = timestamp(f"{whole}.{(fraction or '0')[:6]:0<6}Z")
            if at >= since:
                return at
    return None


def wake(
    cluster: Cluster, infer: Callable[[str], Any], text: str, kubelet_log: Path, keda_log: Path | None = None
) -> dict[str, Any]:
    """One request sent at zero, answered 200; its steps in seconds from the send (None where the
    kubelet's log has no line for one). The service time is the pod's own (tts_synthesis_seconds
    and tts_queue_wait_seconds), so `answered_s - service_s` is when the pod began on it. With
    `keda_log` (the KEDA operator's), also when KEDA scaled the Deployment from zero."""
    from testing.predictor import metric_in

    eventually("the stable predictor at zero", lambda: at_zero(cluster), 240, every=1.0)
    time.sleep(2)  # past the last pod's removal: this wake starts from nothing of ours
    sent = time.time()
    response = infer(text)
    answered = time.time()
    assert response.status_code == 200, response.text[:300]

    # The pod it woke: the newest not terminating (a revision's old pod may still be going).
    live = [p for p in stable_pods(cluster) if "deletionTimestamp" not in p["metadata"]]
    name = max(live, key=lambda p: p["metadata"]["creationTimestamp"])["metadata"]["name"]
    ready_line = cluster.model_ready(NAMESPACE, name)
    model_ready = timestamp(ready_line["ts"])
    exposition = cluster.pod_metrics(NAMESPACE, name)
    service = metric_in(exposition, "tts_synthesis_seconds_sum") + metric_in(
        exposition, "tts_queue_wait_seconds_sum"
    )
    steps = {
        k: (v - sent if v is not None else None) for k, v in kubelet_steps(kubelet_log, name, sent).items()
    }
    if keda_log is not None:
        scaled = eventually(
            "KEDA's scale from zero in its log", lambda: keda_scaled_from_zero(keda_log, sent), 10
        )
        assert scaled is not None  # eventually returns only what is found
        steps["keda_scaled"] = scaled - sent
    return {
        "pod": name,
        **steps,
        "process_start_s": model_ready - ready_line["cold_start_s"] - sent,
        "model_ready_s": model_ready - sent,
        "served_s": answered - service - sent,
        "answered_s": answered - sent,
        "cold_start_s": ready_line["cold_start_s"],
        "service_s": service,
    }


# A wake's pod start, predicted against the cluster: the median error over the wakes. The model before the kubelet's steps were timed was 0.25 s (keda) and 0.43 s (knative) off
# at the median of the same wakes, the model after 0.09 s (keda), 0.06 s (knative with a startup
# probe) and 0.14 s (without: the flavour as shipped) (docs/cluster.md).
WAKE_ERROR_S = 0.2

# The HTTP add-on scaler's tickers, whose phases decide when KEDA hears of a request at zero.
_KEDA_PUSH_TICKERS = ("keda.http.queue_tick_s", "keda.http.stream_interval_s")


def keda_push_max_s(overlay: Path) -> float:
    """The longest the model has KEDA wait to hear of a request at zero: the scaler's next ping of
    the interceptors, then its stream's next send (tts_ops/simulate/simulator.py `_activate`)."""
    from tts_ops.simulate import settings

    _, values = settings.from_manifests(overlay)
    return float(sum(values[key] for key in _KEDA_PUSH_TICKERS))


def predicted_wakes(overlay: Path, wakes: list[dict[str, Any]], seeds: int = 9) -> list[float]:
    """Each wake's answer time as the simulator predicts it from zero, given the wake's own cold
    start and service time (so only the pod's start around them is predicted): the median over
    `seeds` draws of the run's ticker phases. Where the wake has KEDA's own scale time, the model
    starts the pod then (the scaler's tickers, whose phase is a draw the model cannot know, set to
    none, and the prediction moved by the measured push): the pod's start is predicted, not the
    luck of the draw, which `wakes_against_the_model` checks against the model's range instead."""
    from tts_ops.simulate import profile, trace

    predicted = []
    for woke in wakes:
        prof = profile.Profile(
            base_s=woke["service_s"], per_char_s=0.0, cold_start_s=woke["cold_start_s"], phases_s={}
        )
        one = trace.Trace([0.0], [1], "one request at zero")
        pushed = woke.get("keda_scaled")
        fixed = [f"{key}=0" for key in _KEDA_PUSH_TICKERS] if pushed is not None else []
        runs = [
            simulate_overlay(overlay, one, prof, f"random.seed={seed}", *fixed)["first_request_latency_s"]
            for seed in range(seeds)
        ]
        predicted.append(statistics.median(runs) + (pushed or 0.0))
    return predicted


def wakes_against_the_model(
    cluster: Cluster,
    infer: Callable[[str], Any],
    overlay: Path,
    count: int,
    kubelet_log: Path,
    keda_log: Path | None = None,
) -> dict[str, Any]:
    """`count` wakes from zero, each with the kubelet at -v=2, and each predicted by the overlay's
    simulator: the wakes with their predictions, and the median error (the e2e report's figures).
    With `keda_log`, each wake's push (request -> KEDA scales) too, and the model's longest."""
    with kubelet_verbosity(cluster, 2):
        wakes = [wake(cluster, infer, SENTENCE, kubelet_log, keda_log) for _ in range(count)]
    predicted = predicted_wakes(overlay, wakes)
    errors = [abs(p - w["answered_s"]) for p, w in zip(predicted, wakes, strict=True)]
    found: dict[str, Any] = {
        "wakes": [{**w, "predicted_s": p} for w, p in zip(wakes, predicted, strict=True)],
        "median_error_s": statistics.median(errors),
    }
    if keda_log is not None:
        found["keda_push_max_s"] = keda_push_max_s(overlay)
    return found
