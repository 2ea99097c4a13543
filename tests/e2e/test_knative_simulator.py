"""`tts-ops simulate` on what real Knative just did (issue 22): the knative e2e overlay's settings, the
traces test_knative replayed (one request at zero through the activator; the burst's send times) and a
profile measured on the canary pod (same image, same limits) must predict the first request's latency
from zero and the time to the second ready replica within 25 % of the cluster, and the most replicas
KPA asked for. The cold start is given as in tests/e2e/test_simulator.py (CPU contention on the node is
not modelled): the woken pod's, and the burst's pods' own."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from testing.kube import NAMESPACE, Cluster, port_forward, ready
from tts_ops.simulate import profile as profiles
from tts_ops.simulate import settings, simulator, trace

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "knative" / "overlays" / "e2e"
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def canary_profile(cluster: Cluster, knative) -> profiles.Profile:
    canary = [p for p in cluster.pods(NAMESPACE, "serving.kserve.io/inferenceservice=tts-canary") if ready(p)]
    assert canary, "no ready canary pod to profile"
    with port_forward(cluster, NAMESPACE, canary[0]["metadata"]["name"], 8080) as url:
        return profiles.measure(url, repeats=1, lengths=(20, 80, 160))


def _simulate(traffic: trace.Trace, prof: profiles.Profile) -> dict[str, Any]:
    flavour, values = settings.from_manifests(OVERLAY)
    assert flavour == "knative"
    return simulator.simulate(flavour, values, prof, traffic).summary()


def _figures(e2e_report: dict[str, Any], key: str) -> Any:
    if key not in e2e_report:
        pytest.skip(f"needs test_knative's figures ({key}): run the whole of tests/e2e")
    return e2e_report[key]


def _within(predicted: float, measured: float) -> bool:
    return abs(predicted - measured) <= TOLERANCE * measured


def test_knative_the_first_request_from_zero_is_predicted_within_25_percent(canary_profile, e2e_report):
    woke = _figures(e2e_report, "knative 0->1")
    chars = len("The quick brown fox jumps over the lazy dog.")
    woken = dataclasses.replace(canary_profile, cold_start_s=woke["predictor_cold_start_s"])

    predicted = _simulate(trace.Trace([0.0], [chars], "one request at zero"), woken)

    e2e_report["knative simulator 0->1"] = {
        "measured_s": woke["answered_s"],
        "predicted_s": predicted["first_request_latency_s"],
        "cold_start_s (canary, the woken pod)": (canary_profile.cold_start_s, woken.cold_start_s),
    }
    assert _within(predicted["first_request_latency_s"], woke["answered_s"]), e2e_report[
        "knative simulator 0->1"
    ]


def test_knative_the_burst_scale_out_is_predicted_within_25_percent(canary_profile, e2e_report):
    burst = _figures(e2e_report, "knative 1->N")
    sends = _figures(e2e_report, "knative 1->N trace")
    traffic = trace.Trace(list(sends["t"]), [sends["chars"]] * len(sends["t"]), "test_knative's burst")
    (cold_start_s, *_) = burst["cold_start_under_load_s"] or [canary_profile.cold_start_s]
    busy = dataclasses.replace(canary_profile, cold_start_s=cold_start_s)

    predicted = _simulate(traffic, busy)

    comparison = {
        "cold_start_s (canary, under load)": (canary_profile.cold_start_s, cold_start_s),
        "max_replicas (KPA's most desired)": (burst["max_desired"], predicted["max_replicas"]),
        "second_replica_ready_s": (burst["second_pod_ready_s"], predicted["second_replica_ready_s"]),
    }
    e2e_report["knative simulator 1->N (measured, predicted)"] = comparison
    off = {
        k: v
        for k, v in comparison.items()
        if not k.startswith("cold") and (v[1] is None or not _within(v[1], v[0]))
    }
    assert not off, f"the simulator is off by more than {TOLERANCE:.0%}: {off}"
