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

from cluster import node
from testing.kube import SENTENCE
from testing.prediction import TOLERANCE, figures, simulate_overlay, within
from testing.prediction import off as prediction_off
from testing.wakes import WAKE_ERROR_S, wakes_against_the_model
from tts_ops.simulate import profile as profiles
from tts_ops.simulate import trace

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "knative" / "overlays" / "e2e"
WAKES = 4  # about 75 s each: the 20 s stable window, the 30 s grace period, the drain, the wake


def _simulate(traffic: trace.Trace, prof: profiles.Profile, *overrides: str) -> dict[str, Any]:
    return simulate_overlay(OVERLAY, traffic, prof, *overrides)


def _figures(e2e_report: dict[str, Any], key: str) -> Any:
    return figures(e2e_report, key, "test_knative")


def test_knative_the_first_request_from_zero_is_predicted_within_25_percent(knative_profile, e2e_report):
    woke = _figures(e2e_report, "knative 0->1")
    chars = len(SENTENCE)
    woken = dataclasses.replace(knative_profile, cold_start_s=woke["predictor_cold_start_s"])

    predicted = _simulate(trace.Trace([0.0], [chars], "one request at zero"), woken)

    e2e_report["knative simulator 0->1"] = {
        "measured_s": woke["answered_s"],
        "predicted_s": predicted["first_request_latency_s"],
        "cold_start_s (canary, the woken pod)": (knative_profile.cold_start_s, woken.cold_start_s),
    }
    assert within(predicted["first_request_latency_s"], woke["answered_s"]), e2e_report[
        "knative simulator 0->1"
    ]


def test_knative_the_burst_scale_out_is_predicted_within_25_percent(knative_profile, e2e_report):
    burst = _figures(e2e_report, "knative 1->N")
    sends = _figures(e2e_report, "knative 1->N trace")
    # test_knative's callers in a loop until the second pod was ready (test_simulator says why closed).
    traffic = trace.generate(
        f"closed:clients={burst['clients']},duration={burst['second_pod_ready_s']:.2f},chars={sends['chars']}"
    )
    (cold_start_s, *_) = burst["cold_start_under_load_s"] or [knative_profile.cold_start_s]
    busy = dataclasses.replace(knative_profile, cold_start_s=cold_start_s)

    # The burst starts beside the pod the 0 -> 1 test woke, if it is still there; the simulator starts
    # with the pods the cluster had, as test_simulator does for keda.
    predicted = _simulate(traffic, busy, f"replicas.start={burst.get('ready_at_start', 0)}")

    comparison = {
        "cold_start_s (canary, under load)": (knative_profile.cold_start_s, cold_start_s),
        "max_replicas (KPA's most desired)": (burst["max_desired"], predicted["max_replicas"]),
        "second_replica_ready_s": (burst["second_pod_ready_s"], predicted["second_replica_ready_s"]),
    }
    e2e_report["knative simulator 1->N (measured, predicted)"] = comparison
    e2e_report["knative simulator 1->N requests sent (cluster, predicted)"] = (
        len(sends["t"]),
        predicted["requests"],
    )
    off = prediction_off(comparison)
    assert not off, f"the simulator is off by more than {TOLERANCE:.0%}: {off}"


def test_knative_each_wake_from_zero_is_predicted_step_by_step(cluster, knative, e2e_report):
    # The pod's start around its cold start: scheduling, the sandbox, and the activator's own probe of
    # the pod every 0.2 s (no startup probe: knative/base/kustomization.yaml), not the kubelet's Ready
    # (tts_ops/simulate/pods.py). Each wake's own cold start and service time are given.
    wakes = wakes_against_the_model(
        cluster, knative.infer, OVERLAY, WAKES, node.STATE / "logs" / "kubelet.log"
    )
    e2e_report["knative simulator wakes"] = wakes
    assert wakes["median_error_s"] <= WAKE_ERROR_S, wakes
