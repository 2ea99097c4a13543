"""The simulator set against what the cluster just did, for both flavours (tests/e2e/test_simulator.py,
test_knative_simulator.py): a profile measured on the canary pod, one run of an e2e overlay's settings,
and the 25 % the predictions must land within."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

from testing.kube import NAMESPACE, SENTENCE, Cluster, port_forward, ready

TOLERANCE = 0.25


def canary_profile(cluster: Cluster) -> Any:
    """A profile measured on the flavour's canary pod (same image, same limits as the stable's)."""
    from tts_ops.simulate import profile

    canary = [p for p in cluster.pods(NAMESPACE, "serving.kserve.io/inferenceservice=tts-canary") if ready(p)]
    assert canary, "no ready canary pod to profile"
    share = mos_sample(canary[0])
    with port_forward(cluster, NAMESPACE, canary[0]["metadata"]["name"], 8080) as url:
        # At the length every e2e trace sends, means of twenty after a pause and twenty back to back
        # (profile.measure): a half-core pod's times have a long tail (the sentence back to back:
        # median 0.54 s, mean 0.60 s, 0.46-1.01 s over 25; 0.47 s after a pause), and a mean of seven
        # moved by 10 % from one profile to the next.
        # No overlap factor: the e2e overlays' pods run one engine worker, which a simulated pod
        # then does whatever the factor (simulator.Simulation.workers).
        # Both flavours' pods record shadow traffic and score SHADOW_MOS_SAMPLE of it with DNSMOS (about
        # 0.75 s of a half-core pod's time over the calls after one): the back-to-back calls carry that
        # share of scored ids, as a burst's pods do on average. Twenty unscored calls back to back took
        # 1.30 times one after a pause, with one scored 1.39; profiles of random ids put the knative
        # burst's p50 at 1.5 s in one e2e run and 4.1 s in the next hour's replay (cluster 3.2, 2.7).
        measured = profile.measure(url, repeats=20, lengths=(len(SENTENCE), 160), overlap=1, mos_sample=share)
        round_trip = _round_trip_s(url)
    # The port-forward's own round trip (through the API server and the kubelet) is the profile's,
    # not the pod's: the replay reaches the pods over the node's network, where it is a millisecond.
    return dataclasses.replace(measured, base_s=max(0.0, measured.base_s - round_trip))


def mos_sample(pod: dict[str, Any]) -> float:
    """The share of requests the pod's predictor scores for MOS: SHADOW_MOS_SAMPLE from its spec, else
    the Settings default, where it records shadow traffic (SHADOW_SINK); else none."""
    from predictor.config import Settings

    env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env", [])}
    if not env.get("SHADOW_SINK"):
        return 0.0
    if env.get("SHADOW_MOS_SAMPLE") is not None:
        return float(env["SHADOW_MOS_SAMPLE"])
    return float(Settings.model_fields["shadow_mos_sample"].default)


def _round_trip_s(url: str, n: int = 10) -> float:
    """The median time of a liveness probe through ``url``: the transport's cost, next to no work."""
    import httpx

    with httpx.Client(timeout=10) as client:
        client.get(url + "/v2/health/live")  # the port-forward's stream opened
        times = []
        for _ in range(n):
            started = time.perf_counter()
            client.get(url + "/v2/health/live")
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def simulate_overlay(overlay: Path, traffic: Any, prof: Any, *overrides: str) -> dict[str, Any]:
    from tts_ops.simulate import settings, simulator

    flavour, values = settings.from_manifests(overlay)
    values = settings.apply_overrides(values, list(overrides))
    return simulator.simulate(flavour, values, prof, traffic).summary()


def figures(e2e_report: dict[str, Any], key: str, producer: str) -> Any:
    """What `producer` measured and put in the e2e report; the test is skipped without it."""
    import pytest

    if key not in e2e_report:
        pytest.skip(f"needs {producer}'s figures ({key}): run the whole of tests/e2e")
    return e2e_report[key]


def within(predicted: float, measured: float) -> bool:
    return abs(predicted - measured) <= TOLERANCE * measured


def off(comparison: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """The (measured, predicted) pairs predicted outside the tolerance, or not at all; the given
    cold starts (keys starting "cold_start_s") are inputs, not predictions. Cold-start waits are
    predictions."""
    return {
        k: v
        for k, v in comparison.items()
        if not k.startswith("cold_start_s") and (v[1] is None or not within(v[1], v[0]))
    }


def calibration_table(calibration: dict[str, dict[str, dict[str, Any]]]) -> str:
    """tests/e2e/test_calibration.py's figures as the README's markdown table: per overlay and trace,
    each figure as cluster / simulator."""
    columns = ("latency_p50_s", "latency_p99_s", "max_replicas", "replica_seconds", "cold_start_waits")
    heads = ("p50 s", "p99 s", "max replicas", "replica-s", "cold-start waits")
    lines = ["| flavour | trace | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]

    def shown(x: Any) -> str:
        if x is None:
            return "-"
        return (
            f"{x:.2f}" if isinstance(x, float) and x < 10 else f"{x:.0f}" if isinstance(x, float) else str(x)
        )

    for overlay, traces in calibration.items():
        for name, row in traces.items():
            cells = [f"{shown(row[c][0])} / {shown(row[c][1])}" for c in columns]
            lines.append(f"| {overlay.split('/')[0]} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
