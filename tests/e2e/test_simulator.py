"""Test 8 of `make e2e` (issue 21): `tts-ops simulate` on what the cluster just did. The keda e2e overlay's
settings, the loads test_scaling ran (one request at zero; its callers in a loop) and a profile
measured on a predictor pod in this cluster (the canary: same image, same limits) must predict the first
request's latency from zero, the most replicas and the time to the second ready replica within 25 % of
what the cluster did. Where they do not, the model is what is wrong (issue 21), not the tolerance.

The profile's synthesis times come from the canary; its cold start is the one the predicted pods had
(from their logs). A cold start depends on what else the node runs at that moment, which the simulator
does not model (CPU contention): the canary's ranged 3.0-3.7 s between runs, the first pod's from zero
2.6-4.8 s, and pods started beside a busy one 4.6-6.7 s. So the test checks the autoscaling path around
the cold start (scheduling, container start, probes, interceptor, HPA), which is what the model is for.
"""

from __future__ import annotations

import dataclasses
import statistics
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
OVERLAY = ROOT / "keda" / "overlays" / "e2e"
SEEDS = 5
WAKES = 4  # about 35 s each: the 20 s cooldown, the pod's drain, the wake


def _simulate(traffic: trace.Trace, prof: profiles.Profile, *overrides: str) -> dict[str, Any]:
    return simulate_overlay(OVERLAY, traffic, prof, *overrides)


def _figures(e2e_report: dict[str, Any], key: str) -> Any:
    return figures(e2e_report, key, "test_scaling")


def test_the_first_request_from_zero_is_predicted_within_25_percent(keda_profile, e2e_report):
    measured = _figures(e2e_report, "0->1")["answered_s"]
    chars = len(SENTENCE)

    woken = dataclasses.replace(keda_profile, cold_start_s=e2e_report["0->1"]["predictor_cold_start_s"])
    predicted = _simulate(trace.Trace([0.0], [chars], "one request at zero"), woken)

    e2e_report["simulator 0->1"] = {
        "measured_s": measured,
        "predicted_s": predicted["first_request_latency_s"],
        "cold_start_s (canary, the woken pod)": (keda_profile.cold_start_s, woken.cold_start_s),
    }
    assert within(predicted["first_request_latency_s"], measured), e2e_report["simulator 0->1"]


def test_the_scale_out_under_load_is_predicted_within_25_percent(keda_profile, e2e_report):
    load = _figures(e2e_report, "1->N")
    sends = _figures(e2e_report, "1->N trace")
    # test_scaling's callers, each sending again as it is answered until the second pod was ready: a
    # closed loop. Replayed open-loop at the cluster's send times, a model a little slower than the
    # cluster queued what the callers never sent, and eight in flight (two pods' worth of the HTTP
    # trigger's 4) became nine and a third pod (3 / 2 replicas in five draws, stop 38).
    traffic = trace.generate(
        f"closed:clients={load['clients']},duration={load['second_pod_ready_s']:.2f},chars={sends['chars']}"
    )

    # When the HPA syncs is set by when kube-controller-manager started, not by the load: the
    # cluster's second pod came after 10.5, 17.7 and 24.2 s in three runs for that reason alone. The
    # simulator is given the phase this run had (when the Deployment first asked for a second pod)
    # and must predict the rest: the pod's start, its readiness, and how far the HPA goes.
    phase = load["first_scale_up_s"]
    assert phase is not None, "the HPA never asked for a second pod"
    # The cold start the load's pods had, beside a busy one (the module's doc says why).
    (cold_start_s, *_) = load["cold_start_under_load_s"]
    busy = dataclasses.replace(keda_profile, cold_start_s=cold_start_s)
    # The load starts beside the pod the 0 -> 1 test woke, if it is still there (its first answer
    # came in half a second); the simulator starts with the pods the cluster had.
    start = load.get("ready_at_start", 0)
    # Which ready pod a request lands on is random (kube-proxy's pick), and moves how far the queue
    # depth trigger goes: the prediction is the median of SEEDS draws.
    runs = [
        _simulate(
            traffic, busy, f"hpa.first_sync_s={phase}", f"replicas.start={start}", f"random.seed={seed}"
        )
        for seed in range(SEEDS)
    ]

    def predicted(key: str) -> Any:
        # None (no second pod) where most draws had none.
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if 2 * len(values) > len(runs) else None

    comparison = {
        "cold_start_s (canary, under load)": (keda_profile.cold_start_s, cold_start_s),
        "max_replicas": (load["max_replicas"], predicted("max_replicas")),
        "second_replica_ready_s": (load["second_pod_ready_s"], predicted("second_replica_ready_s")),
    }
    e2e_report["simulator 1->N draws"] = [
        {k: r[k] for k in ("max_replicas", "second_replica_ready_s", "requests")} for r in runs
    ]
    e2e_report["simulator 1->N requests sent (cluster)"] = len(sends["t"])
    e2e_report["simulator 1->N (measured, predicted)"] = comparison
    off = prediction_off(comparison)
    assert not off, f"the simulator is off by more than {TOLERANCE:.0%}: {off}"


def test_each_wake_from_zero_is_predicted_step_by_step(cluster, keda, e2e_report):
    # The pod's start around its cold start: scheduling, the sandbox, the probes' ticks (from the
    # kubelet's probe workers, not the process) and the interceptor's endpoints
    # (tts_ops/simulate/pods.py). Each wake's own cold start and service time are given, and so is
    # its push (request -> KEDA scales, from KEDA's log): the add-on scaler's tickers run from its
    # start, so where a request falls between their ticks is a draw the model cannot know (0-0.7 s;
    # predicted from the draws' median, four wakes in one run missed by 0.03-0.34 s, by 0.02-0.13 s
    # given it). The push itself must stay within what the tickers allow.
    logs = node.STATE / "logs"
    wakes = wakes_against_the_model(
        cluster, keda.infer, OVERLAY, WAKES, logs / "kubelet.log", logs / "keda-operator.log"
    )
    e2e_report["simulator wakes"] = wakes
    assert wakes["median_error_s"] <= WAKE_ERROR_S, wakes
    pushes = [w["keda_scaled"] for w in wakes["wakes"]]
    assert all(0 <= p <= wakes["keda_push_max_s"] + WAKE_ERROR_S for p in pushes), (
        pushes,
        wakes["keda_push_max_s"],
    )
