"""Wakes from zero timed step by step, for the simulator's pod start (tts_ops/simulate/pods.py): the
kubelet's own log at -v=2 (microseconds) against the request's send and the predictor's "model ready"
line, where the API's timestamps have whole seconds (tests/e2e/test_simulator.py,
test_knative_simulator.py; docs/cluster.md "A pod's start, step by step")."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testing.kube import NAMESPACE, Cluster, at_zero, eventually, stable_pods, timestamp

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


def wake(cluster: Cluster, infer: Callable[[str], Any], text: str, kubelet_log: Path) -> dict[str, Any]:
    """One request sent at zero, answered 200; its steps in seconds from the send (None where the
    kubelet's log has no line for one). The service time is the pod's own (tts_synthesis_seconds
    and tts_queue_wait_seconds), so `answered_s - service_s` is when the pod began on it."""
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
