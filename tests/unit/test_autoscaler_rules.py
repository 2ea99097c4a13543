"""Rules of our autoscaler models that upstream's ported tables leave unproven: the HPA's tolerance
band (every upstream tolerance case gives the same count with or without it) and KEDA's executor
(activation from zero, cooldown, initial cooldown, minReplicaCount above zero) and the kubelet probes
that end a pod's start.

Each tolerance case is checked twice: inside the band the count stays, and the same inputs with no
tolerance change it, so the case fails if the model loses its tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from tts_ops.simulate import hpa, keda, pods, profile, settings, simulator, trace
from tts_ops.simulate.errors import SimulateError

ROOT = Path(__file__).resolve().parents[2]

# (name, usage, target per pod, current, want with the default 0.1 tolerance, want with none)
PER_POD = [
    ("5 % over the target stays", 10_500, 1000, 10, 10, 11),
    ("5 % under the target stays", 19_000, 1000, 20, 20, 19),
    ("11 % over scales up", 11_100, 1000, 10, 12, 12),
    ("11 % under scales down", 17_800, 1000, 20, 18, 18),
]


@pytest.mark.parametrize(("name", "usage", "target", "current", "want", "untolerated"), PER_POD)
def test_average_value_metric_inside_the_tolerance_keeps_the_count(
    name, usage, target, current, want, untolerated
):
    assert hpa.per_pod_replicas(usage, target, current, hpa.DEFAULT_TOLERANCE) == want
    assert hpa.per_pod_replicas(usage, target, current, 0.0) == untolerated


# (name, usage, target, ready, current, want with 0.1, want with none)
VALUE = [
    ("8 % over the target stays", 1080, 1000, 10, 10, 10, 11),
    ("8 % under the target stays", 920, 1000, 20, 20, 20, 19),
    ("12 % over scales the ready pods", 1120, 1000, 10, 10, 12, 12),
]


@pytest.mark.parametrize(("name", "usage", "target", "ready", "current", "want", "untolerated"), VALUE)
def test_value_metric_inside_the_tolerance_keeps_the_count(
    name, usage, target, ready, current, want, untolerated
):
    assert hpa.value_replicas(usage, target, ready, current, hpa.DEFAULT_TOLERANCE) == want
    assert hpa.value_replicas(usage, target, ready, current, 0.0) == untolerated


def test_the_tolerance_is_a_setting_a_wider_band_holds_more():
    assert hpa.per_pod_replicas(11_500, 1000, 10, 0.2) == 10
    assert hpa.per_pod_replicas(11_500, 1000, 10, 0.1) == 12


# --- KEDA's executor ---------------------------------------------------------------------------
def test_an_active_trigger_at_zero_scales_to_one_or_to_min_replicas():
    assert keda.Executor(300, 0, min_replicas=0).decide(10, True, 0) == 1
    assert keda.Executor(300, 0, min_replicas=3).decide(10, True, 0) == 3


def test_an_active_trigger_above_zero_leaves_the_count_to_the_hpa():
    executor = keda.Executor(300, 0, min_replicas=0)

    assert executor.decide(10, True, 4) is None
    assert executor.last_active_s == 10


def test_scale_to_zero_waits_for_the_cooldown_after_the_last_active_poll():
    executor = keda.Executor(cooldown_s=300, initial_cooldown_s=0, min_replicas=0)
    executor.decide(100, True, 2)  # the last active poll

    assert executor.decide(130, False, 2) is None
    assert executor.decide(399, False, 2) is None
    assert executor.decide(401, False, 2) == 0


def test_an_active_poll_during_the_cooldown_restarts_it():
    executor = keda.Executor(cooldown_s=300, initial_cooldown_s=0, min_replicas=0)
    executor.decide(100, True, 1)
    executor.decide(350, True, 1)

    assert executor.decide(450, False, 1) is None
    assert executor.decide(651, False, 1) == 0


def test_nothing_active_since_creation_waits_for_the_initial_cooldown_only():
    # No last active time: the cooldown does not apply (KEDA scales such a target down at once),
    # but initialCooldownPeriod, counted from creation at 0 s, does.
    executor = keda.Executor(cooldown_s=300, initial_cooldown_s=120, min_replicas=0)

    assert executor.decide(60, False, 1) is None
    assert executor.decide(119, False, 1) is None
    assert executor.decide(120, False, 1) == 0


def test_the_initial_cooldown_also_holds_after_an_early_active_poll():
    executor = keda.Executor(cooldown_s=30, initial_cooldown_s=600, min_replicas=0)
    executor.decide(10, True, 1)

    assert executor.decide(100, False, 1) is None  # the 30 s cooldown has passed, the 600 s has not
    assert executor.decide(600, False, 1) == 0


def test_inactive_at_zero_stays_at_zero():
    assert keda.Executor(300, 0, min_replicas=0).decide(1000, False, 0) is None


def test_min_replicas_above_zero_leaves_scale_down_to_the_hpa_and_refills_below_it():
    executor = keda.Executor(cooldown_s=300, initial_cooldown_s=0, min_replicas=2)
    executor.decide(0, True, 5)

    assert executor.decide(10_000, False, 5) is None  # long past the cooldown: the HPA scales down
    assert executor.decide(10_000, False, 2) is None
    assert executor.decide(10_000, False, 1) == 2


# --- pod start (kubelet probes) -------------------------------------------------------------------
def test_a_pod_is_ready_at_the_startup_probes_first_pass_or_without_one_the_readiness_probes():
    # The local cluster's finding: with the startup probe every 10 s, a 2.6 s cold start waited for
    # the probe at 10 s (docs/cluster.md). Its pass triggers the readiness probe at once.
    every_10 = pods.PodTiming(1.0, 0.0, 2.6, readiness_period_s=1.0, startup_period_s=10.0)
    every_1 = pods.PodTiming(1.0, 0.0, 2.6, readiness_period_s=1.0, startup_period_s=1.0)
    no_startup_probe = pods.PodTiming(1.0, 0.0, 2.6, readiness_period_s=5.0)

    assert every_10.ready_after() == pytest.approx(1.0 + 10.0)
    assert every_1.ready_after() == pytest.approx(1.0 + 3.0)
    assert no_startup_probe.ready_after() == pytest.approx(1.0 + 5.0)


def test_the_probes_tick_from_the_kubelets_probe_workers_not_from_the_process_start():
    # Measured on the local cluster (docs/cluster.md): the startup probe's ticks lead the process by
    # 0.12 s, so a 3.93 s cold start passes at the tick 4.88 s after the process started (5 s after
    # the workers), not at 4 s; the interceptor sends the first request 0.1 s after Ready.
    timing = pods.PodTiming(
        0.44, 0.0, 3.93, readiness_period_s=1.0, startup_period_s=1.0, sandbox_s=0.12, routed_s=0.1
    )

    assert timing.probed(0.12 + 3.93) == pytest.approx(5.0)
    assert timing.ready_after() == pytest.approx(0.44 + 5.0 + 0.1)


def test_under_knative_ready_also_waits_for_queue_proxys_readiness_tick():
    # Knative moves the readiness probe to queue-proxy, whose ticks start when the kubelet sees it
    # running; the startup probe stays on our container. Ready needs both.
    timing = pods.PodTiming(0.4, 0.0, 3.0, readiness_period_s=1.0, startup_period_s=1.0, sandbox_s=0.1)
    knative = dataclasses.replace(timing, queue_proxy=True)
    process_ready = 0.1 + 3.0

    # queue-proxy seen 0.05 s after the workers started: its ticks at 3.05 (too early) and 4.05.
    assert timing.probed(process_ready, seen_s=0.05) == pytest.approx(4.0)  # the startup probe's tick
    assert knative.probed(process_ready, seen_s=0.05) == pytest.approx(4.05)  # queue-proxy's, later
    assert knative.probed(process_ready, seen_s=0.5) == pytest.approx(4.0)  # its 3.5 was the earlier


def test_a_request_at_keda_zero_wakes_keda_at_the_scalers_next_push_after_its_next_ping():
    # kedacore/http-add-on's scaler pings the interceptors every 0.5 s and pushes to KEDA every
    # 0.2 s: a request at 0.3 s with the ping's ticks at 0.1 + k/2 and the stream's at 0.05 + k/5 is
    # counted at 0.6 s and pushed at 0.65 s, when the first pod is created.
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    prof = profile.Profile(base_s=0.5, per_char_s=0.0, cold_start_s=1.0, phases_s={})
    sim = simulator.Simulation("keda", values, prof, trace.Trace([0.3], [10], "one"))
    sim.ping_phase, sim.stream_phase = 0.1, 0.05
    created: list[float] = []
    scale_to = sim._scale_to

    def noting_creation(target: int) -> None:
        if target > len(sim._active_pods()):
            created.append(sim.now)
        scale_to(target)

    sim._scale_to = noting_creation  # type: ignore[method-assign]
    sim.run()

    assert created[0] == pytest.approx(0.65)


def test_without_a_startup_probe_the_activator_routes_to_a_pod_at_its_own_first_passing_probe():
    # knative/serving's activator probes a revision's pods in rounds (0.3 s apart on the cluster)
    # and, with no startup probe, trusts a pass before the kubelet's Ready (revision_backends.go:
    # enableProbeOptimisation).
    _flavour, values = settings.from_manifests(ROOT / "knative" / "overlays" / "e2e")
    prof = profile.Profile(base_s=0.5, per_char_s=0.0, cold_start_s=1.0, phases_s={})

    def first_ready(startup_period_s: float) -> float:
        run = {**values, "pod.startup_period_s": startup_period_s}
        sim = simulator.Simulation("knative", run, prof, trace.Trace([0.0], [10], "one"))
        sim.activator_phase = 0.05
        ready: list[float] = []
        dispatch = sim._dispatch

        def noting_ready() -> None:
            if sim._ready_pods() and not ready:
                ready.append(sim.now)
            dispatch()

        sim._dispatch = noting_ready  # type: ignore[method-assign]
        sim.run()
        return ready[0]

    sandbox = values["pod.sandbox_s"] + values["kpa.queue_proxy_s"]
    process_ready = values["pod.schedule_s"] + sandbox + 1.0
    rounds = values["kpa.activator_probe_s"]
    without = first_ready(0.0)
    assert without == pytest.approx(0.05 + rounds * math.ceil((process_ready - 0.05) / rounds))
    assert first_ready(1.0) >= without + values["kpa.activator_routes_s"]


def test_the_manifests_startup_probe_period_reaches_the_simulator():
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "cpu")
    _flavour, knative = settings.from_manifests(ROOT / "knative" / "overlays" / "cpu")

    assert values["pod.startup_period_s"] == 1.0
    assert values["pod.readiness_period_s"] == 1.0
    assert knative["pod.startup_period_s"] == 0.0  # dropped: knative/base/kustomization.yaml


def _knative_run(times: list[float], chars: list[int], **overrides: Any) -> dict[str, Any]:
    _flavour, values = settings.from_manifests(ROOT / "knative" / "overlays" / "cpu")
    values.update({"replicas.start": 1, "replicas.min": 1, "replicas.max": 1, **overrides})
    prof = profile.Profile(base_s=0.0, per_char_s=0.1, cold_start_s=1.0, phases_s={})
    return simulator.simulate("knative", values, prof, trace.Trace(times, chars, "test")).summary()


def test_knative_ends_a_request_at_the_revision_timeout_and_no_latency_exceeds_it():
    # The finding: a burst far beyond the pods predicted a p99 of 3,791 s on a revision whose
    # timeout is 60 s. The activator answers 504 at the timeout instead (tests/e2e/test_knative_timeout.py).
    times = [i * 0.05 for i in range(2000)]  # 20 per second for 100 s, one pod of 1 per 10 s
    summary = _knative_run(times, [100] * len(times), **{"kpa.revision_timeout_s": 60.0})

    assert summary["latency_max_s"] <= 60.0
    assert summary["completed"] + summary["timed_out"] + summary["rejected"] == summary["requests"]
    assert summary["timed_out"] > 1000


def test_a_timed_out_synthesis_keeps_its_pod_busy_until_the_engine_call_ends():
    # One pod, one request at a time: the first (10 s of synthesis) times out at 3 s but the engine
    # finishes it; the second (1 s), sent at 0.5 s, starts only then, as measured on the cluster
    # (a 504 at 3.04 s, the pod serving again 8.9 s later).
    summary = _knative_run(
        [0.0, 0.5], [100, 10], **{"kpa.revision_timeout_s": 30.0, "kpa.container_concurrency": 1}
    )
    assert summary["timed_out"] == 0 and summary["latency_max_s"] == pytest.approx(10.5)

    summary = _knative_run(
        [0.0, 0.5], [100, 10], **{"kpa.revision_timeout_s": 3.0, "kpa.container_concurrency": 1}
    )
    # The second waited for the abandoned first until 10 s: past its own timeout too.
    assert summary["timed_out"] == 2 and summary["completed"] == 0

    # Timed out at 8 s, the first still holds the engine until 10 s: the second, sent at 5 s, answers
    # at 11 s (6 s), not at 9 s as it would if the abandoned work stopped at the timeout.
    summary = _knative_run(
        [0.0, 5.0], [100, 10], **{"kpa.revision_timeout_s": 8.0, "kpa.container_concurrency": 1}
    )
    assert summary["timed_out"] == 1 and summary["latency_max_s"] == pytest.approx(6.0)


def test_with_the_activator_in_the_path_a_pod_never_holds_more_than_container_concurrency_and_none_is_refused():
    # The default target-burst-capacity (200) keeps the activator in the path for a few pods: it
    # holds the excess, so a burst far beyond one pod waits (and may time out), never 503.
    times = [i * 0.01 for i in range(300)]
    summary = _knative_run(times, [10] * len(times), **{"kpa.container_concurrency": 3})
    assert summary["rejected"] == 0


def test_without_the_activator_queue_proxy_refuses_beyond_ten_times_container_concurrency():
    # target-burst-capacity 0: the SKS goes to Serve mode once a pod is up, requests reach the pod
    # directly, and its queue-proxy holds 3 in flight + 30 queued, answering 503 beyond.
    times = [5.0 + i * 0.001 for i in range(100)]  # after the first KPA ticks; 0.1 s each
    summary = _knative_run(
        times, [1] * len(times), **{"kpa.container_concurrency": 3, "kpa.target_burst_capacity": 0.0}
    )
    assert summary["rejected"] == 100 - 33 and summary["completed"] == 33


def test_the_activator_holds_at_most_its_queue_depth_per_revision():
    times = [0.0] * (simulator.ACTIVATOR_QUEUE + 5)
    summary = _knative_run(
        times, [1] * len(times), **{"replicas.start": 0, "replicas.min": 0, "kpa.revision_timeout_s": 1.0}
    )
    assert summary["rejected"] == 5


def test_without_container_concurrency_the_predictors_own_queue_refuses_the_excess():
    # containerConcurrency 0: neither the activator nor queue-proxy limit a pod; MAX_QUEUE (32) does.
    times = [5.0 + i * 0.001 for i in range(100)]
    summary = _knative_run(times, [1] * len(times), **{"kpa.container_concurrency": 0})
    assert summary["rejected"] == 100 - 33


def test_keda_counts_the_cooldown_from_the_last_answer_not_the_last_arrival():
    # The add-on reports the host active while a request is in flight: the pod stays 20 s
    # (cooldownPeriod) past the answer, as the cluster's did (tests/e2e/test_calibration.py). The
    # answer (about 9.6 s: the pod's start, then 6.5 s) lands after the poll at 5 s and before the
    # one at 10 s, so counting from the last poll that saw it in flight would end the pod 5 s early.
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    assert values["keda.polling_interval_s"] == 5.0
    prof = profile.Profile(base_s=6.5, per_char_s=0.0, cold_start_s=1.0, phases_s={})
    result = simulator.simulate("keda", values, prof, trace.Trace([0.0], [10], "test"))
    answered = result.latencies[0]
    assert answered is not None
    assert 5.0 < answered < 10.0
    # The pod is created within the scaler's two ticks (0.7 s) of the request at 0 s.
    assert result.replica_seconds >= answered + values["keda.cooldown_s"] - 0.7


def test_a_revision_the_activator_never_left_goes_to_zero_at_the_retention_not_the_grace_period():
    # handleScaleToZero's fast path: proxied for the grace period already, so retention 0 means the
    # pod goes once the stable window (20 s) sees no load; the e2e cluster's idle pod lived 30 s
    # (tests/e2e/test_calibration.py). Out of the path (target-burst-capacity 0) the 30 s grace
    # period starts when the decider first says zero.
    _flavour, values = settings.from_manifests(ROOT / "knative" / "overlays" / "e2e")
    prof = profile.Profile(base_s=0.3, per_char_s=0.0, cold_start_s=6.0, phases_s={})

    def pod_seconds(**overrides: Any) -> float:
        run = simulator.simulate("knative", {**values, **overrides}, prof, trace.Trace([0.0], [1], "idle"))
        return run.replica_seconds

    proxied = pod_seconds()
    served = pod_seconds(**{"kpa.target_burst_capacity": 0.0})
    assert values["kpa.pod_retention_s"] == 0 and values["kpa.scale_to_zero_grace_s"] == 30
    assert proxied == pytest.approx(30, abs=3)
    assert served - proxied == pytest.approx(30, abs=3)


def _spread(sim: simulator.Simulation) -> simulator.Simulation:
    """Each request to the least busy pod: where the interceptor's random pick (keda) sends it is not
    what the node's tests are about."""

    def least_busy(http: bool = True) -> pods.Pod | None:
        return min(sim._ready_pods(), key=lambda p: p.in_flight, default=None)

    sim._pick_pod = least_busy  # type: ignore[method-assign]
    return sim


def test_work_beyond_the_nodes_cores_shares_them_and_is_re_timed_as_pieces_start_and_end():
    # Four e2e pods on the 2-core node (tests/e2e/test_calibration.py), each synthesizing 1 s of work.
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    prof = profile.Profile(base_s=1.0, per_char_s=0.0, cold_start_s=1.0, phases_s={})

    def latencies(times: list[float], cpus: float, pod_cpus: float = 1.0) -> list[float]:
        sim = _spread(
            simulator.Simulation(
                "keda",
                {**values, "replicas.start": 4, "replicas.max": 4, "node.cpus": cpus, "pod.cpus": pod_cpus},
                prof,
                trace.Trace(times, [10] * len(times), "four"),
            )
        )
        return sorted(x for x in sim.run().latencies if x is not None)

    # One core each: the profile's time.
    assert latencies([0.0] * 4, 0.0) == pytest.approx([1.0] * 4, abs=0.01)
    # Four at once on two cores: half a core each, 2 s.
    assert latencies([0.0] * 4, 2.0) == pytest.approx([2.0] * 4, abs=0.01)
    # One alone for 0.5 s (one core: a piece never runs faster), then four share two cores: the first
    # has 0.5 s of work left at half speed (ends at 1.5 s); the other three then share two cores
    # (2/3 each) for their last 0.5 s: 0.75 s more, 1.75 s after they arrived.
    assert latencies([0.0, 0.5, 0.5, 0.5], 2.0) == pytest.approx([1.5, 1.75, 1.75, 1.75], abs=0.01)
    # Pods of half a core (the profile measured on one): four ask for the node's two, no slower; on
    # 1.5 cores, each runs at three quarters of its own speed.
    assert latencies([0.0] * 4, 2.0, pod_cpus=0.5) == pytest.approx([1.0] * 4, abs=0.01)
    assert latencies([0.0] * 4, 1.5, pod_cpus=0.5) == pytest.approx([4 / 3] * 4, abs=0.01)


def test_the_nodes_cores_changing_over_time_re_time_the_work_under_way():
    # Two pods of one core each, 2 s of work each from 0 s, on the two cores the node leaves them:
    # 2 s. Where the rest of the node takes one core from 1 s on (starting pods, say), their second
    # second of work runs at half speed.
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    prof = profile.Profile(base_s=2.0, per_char_s=0.0, cold_start_s=1.0, phases_s={})

    def latencies(over_time: str) -> list[float]:
        sim = _spread(
            simulator.Simulation(
                "keda",
                {
                    **values,
                    "replicas.start": 2,
                    "pod.cpus": 1.0,
                    "node.cpus": 2.0,
                    "node.cpus_over_time": over_time,
                },
                prof,
                trace.Trace([0.0, 0.0], [10, 10], "two"),
            )
        )
        return sorted(x for x in sim.run().latencies if x is not None)

    assert latencies("") == pytest.approx([2.0, 2.0], abs=0.01)
    # 1 s done by 1 s; from 1 s half a core each: 1 s of work left takes 2 s.
    assert latencies("1:1") == pytest.approx([3.0, 3.0], abs=0.01)
    # From 1.5 s half speed, from 2 s full again: 1.5 + 0.25 done by 2 s, the last 0.25 by 2.25 s.
    assert latencies("1.5:1,2:2") == pytest.approx([2.25, 2.25], abs=0.01)


def test_a_call_right_after_another_on_its_pod_takes_the_back_to_back_time():
    # One pod, 1 s a call after idle and 1.5 s right after another (a CPU quota partly spent).
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    prof = profile.Profile(base_s=1.0, per_char_s=0.0, cold_start_s=1.0, phases_s={}, back_to_back_factor=1.5)

    def latencies(times: list[float]) -> list[float | None]:
        sim = simulator.Simulation(
            "keda", {**values, "replicas.start": 1}, prof, trace.Trace(times, [10] * len(times), "one pod")
        )
        return [None if x is None else round(x, 3) for x in sim.run().latencies]

    # Three at once: the first after idle, the next two each straight after the one before.
    assert latencies([0.0, 0.0, 0.0]) == [1.0, 2.5, 4.0]
    # Two seconds apart: each after idle. 0.1 s after the last ended (within BACK_TO_BACK_S): back to back.
    assert latencies([0.0, 3.0]) == [1.0, 1.0]
    assert latencies([0.0, 1.1]) == [1.0, 1.5]
    # A profile that did not measure it: every call at its time after idle.
    prof = dataclasses.replace(prof, back_to_back_factor=0.0)
    assert latencies([0.0, 0.0]) == [1.0, 2.0]


def test_a_schedule_of_the_nodes_cores_that_is_not_time_cores_pairs_is_refused():
    assert settings.cpus_over_time("0:1.5, 2.4:0.8") == [(0.0, 1.5), (2.4, 0.8)]
    for bad, says in (
        ("1.5", "not T:CPUS"),
        ("1:x", "not T:CPUS"),
        ("1:-1", "not T:CPUS"),
        ("2:1,1:1", "go back"),
    ):
        with pytest.raises(SimulateError, match=says):
            settings.cpus_over_time(bad)


def test_a_cold_start_beside_busy_pods_shares_the_nodes_cores():
    # Two pods busy for a long time; a third pod starts (1 s of cold-start work alone). On two cores
    # the three pieces run at two thirds of a core each: ready after 1.5 s. One core each: 1 s.
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    prof = profile.Profile(base_s=20.0, per_char_s=0.0, cold_start_s=1.0, phases_s={})

    def third_pod_ready_after(cpus: float) -> float:
        sim = _spread(
            simulator.Simulation(
                "keda",
                {**values, "replicas.start": 2, "node.cpus": cpus, "pod.cpus": 1.0},
                prof,
                trace.Trace([0.0, 0.0], [10, 10], "two long"),
            )
        )
        sim.timing = pods.PodTiming(0.0, 0.0, 1.0, readiness_period_s=0.0)
        ready: list[float] = []
        arrive, dispatch = sim._arrive, sim._dispatch

        def arrive_then_start_a_pod(i: int) -> None:
            arrive(i)
            if i == 1:
                sim._scale_to(3)

        def noting_ready() -> None:
            if len(sim._ready_pods()) == 3 and not ready:
                ready.append(sim.now)
            dispatch()

        sim._arrive, sim._dispatch = arrive_then_start_a_pod, noting_ready  # type: ignore[method-assign]
        sim.run()
        return ready[0]

    assert third_pod_ready_after(0.0) == pytest.approx(1.0, abs=0.01)
    assert third_pod_ready_after(2.0) == pytest.approx(1.5, abs=0.01)


def test_a_keda_run_is_repeatable_by_its_seed_and_another_seed_is_another_draw():
    # Four ready pods, 40 requests of 1 s at once: which pods they land on is the random pick.
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    prof = profile.Profile(base_s=1.0, per_char_s=0.0, cold_start_s=1.0, phases_s={})

    def latencies(seed: int) -> list[float | None]:
        run = {**values, "replicas.start": 4, "replicas.max": 4, "random.seed": seed}
        return simulator.simulate("keda", run, prof, trace.Trace([0.0] * 40, [10] * 40, "forty")).latencies

    assert latencies(0) == latencies(0)
    assert len({tuple(latencies(seed)) for seed in range(4)}) > 1
    assert settings.apply_overrides(values, ["random.seed=3"])["random.seed"] == 3


def _pods_serving(
    flavour: str, times: list[float], **overrides: Any
) -> tuple[list[int], simulator.Simulation]:
    """The pod each request of 0.5 s went to, on ready pods of the flavour's e2e overlay, and the run."""
    _flavour, values = settings.from_manifests(ROOT / flavour / "overlays" / "e2e")
    prof = profile.Profile(base_s=0.5, per_char_s=0.0, cold_start_s=1.0, phases_s={})
    sim = simulator.Simulation(
        flavour, {**values, **overrides}, prof, trace.Trace(times, [10] * len(times), "t")
    )
    served: dict[int, int] = {}
    assign = sim._assign

    def noting(pod: pods.Pod, i: int) -> None:
        served[i] = pod.id
        assign(pod, i)

    sim._assign = noting  # type: ignore[method-assign]
    sim.run()
    return [served[i] for i in range(len(times))], sim


def test_keda_requests_one_at_a_time_reuse_the_interceptors_idle_connection_to_one_pod():
    # Go's pool hands back the connection the last answer returned; kube-proxy picks a pod only when
    # a connection is dialled. Ten sequential requests on three pods, at random, would all land on one
    # pod once in 3^9 runs.
    for seed in range(4):
        served, _sim = _pods_serving(
            "keda",
            [float(k) for k in range(10)],
            **{"replicas.start": 3, "replicas.min": 3, "random.seed": seed},
        )
        assert len(set(served)) == 1, (seed, served)


def test_an_answer_with_requests_waiting_behind_it_closes_its_connection():
    # Four at once on a one-worker pod: the pod decides as each answer starts, while that request is
    # still admitted (predictor/serving/service.py, busy), so the first three, each with another
    # behind it, say Connection: close (CLOSE_WHEN_BUSY); only the last goes back to the pool.
    # Counting the answered request out first kept the third too, which sent the interceptor's
    # new requests to the backlogged first pod less often than the cluster did (keda burst).
    _served, sim = _pods_serving(
        "keda", [0.0] * 4, **{"replicas.start": 1, "replicas.min": 1, "replicas.max": 1}
    )
    assert sim.workers == 1 and len(sim.idle) == 1
    _served, sim = _pods_serving(
        "keda",
        [0.0] * 4,
        **{"replicas.start": 1, "replicas.min": 1, "replicas.max": 1, "pod.close_when_busy": False},
    )
    assert len(sim.idle) == 4


def test_knatives_activator_fills_the_first_pod_by_address_before_the_next_at_low_container_concurrency():
    # containerConcurrency 1-3: the throttler's first pod with a free slot, in address order
    # (serving lb_policy.go firstAvailableLBPolicy). Two requests 0.1 s apart on three idle one-worker
    # pods both go to the first, the second waiting behind it; least-loaded (the model before) spread
    # them, where the cluster's burst found 0.3 s more per request once the backlog was gone.
    three = {"replicas.start": 3, "replicas.min": 3, "replicas.max": 3, "pod.engine_workers": 1}
    for seed in range(4):
        served, sim = _pods_serving(
            "knative", [0.0, 0.1], **three, **{"kpa.container_concurrency": 2, "random.seed": seed}
        )
        first = min((p for p in sim.pods), key=lambda p: p.address)
        assert served == [first.id, first.id]
        assert sim.latency[1] == pytest.approx(0.9)  # behind the first: 1.0 - 0.1
    # A third while both are in flight: the first is full, so the next by address.
    served, sim = _pods_serving("knative", [0.0, 0.1, 0.2], **three, **{"kpa.container_concurrency": 2})
    by_address = [p.id for p in sorted(sim.pods, key=lambda p: p.address)]
    assert served == [by_address[0], by_address[0], by_address[1]]


def test_knatives_activator_goes_round_robin_above_container_concurrency_three():
    # newRoundRobinPolicy: from the pod after the last one picked, the first with a free slot.
    three = {"replicas.start": 3, "replicas.min": 3, "replicas.max": 3, "kpa.container_concurrency": 4}
    served, sim = _pods_serving("knative", [0.0, 1.0, 2.0, 3.0], **three)
    by_address = [p.id for p in sorted(sim.pods, key=lambda p: p.address)]
    assert served == [*by_address, by_address[0]]


def test_requests_the_interceptor_held_at_zero_reach_the_first_pod_in_no_particular_order():
    # Each waits in its own goroutine until an endpoint is ready; they wake together. Oldest first,
    # the answers would come in arrival order in every run.
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    prof = profile.Profile(base_s=0.5, per_char_s=0.0, cold_start_s=1.0, phases_s={})
    times = [0.1 * k for k in range(6)]
    orders = set()
    for seed in range(4):
        run = {**values, "replicas.max": 1, "random.seed": seed}
        latencies = simulator.simulate("keda", run, prof, trace.Trace(times, [10] * 6, "held")).latencies
        answered = [t + x for t, x in zip(times, latencies, strict=True) if x is not None]
        assert len(answered) == 6
        orders.add(tuple(sorted(range(6), key=lambda k: answered[k])))
    assert orders != {tuple(range(6))} and len(orders) > 1


def test_the_manifests_close_when_busy_reaches_the_simulator():
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    assert values["pod.close_when_busy"] is True
    assert settings.apply_overrides(values, ["pod.close_when_busy=false"])["pod.close_when_busy"] is False
    with pytest.raises(SimulateError, match="expected a bool"):
        settings.apply_overrides(values, ["pod.close_when_busy=maybe"])


# --- engine workers in a pod -------------------------------------------------------------------
def _worker_latencies(arrivals: int, workers: int, overlap_factor: float) -> list[float | None]:
    """Latencies of `arrivals` requests at t=0 of 1 s alone each, on one ready knative cpu pod."""
    _flavour, values = settings.from_manifests(ROOT / "knative" / "overlays" / "cpu")
    values.update({"replicas.start": 1, "replicas.min": 1, "replicas.max": 1, "pod.engine_workers": workers})
    prof = profile.Profile(
        base_s=0.0, per_char_s=0.1, cold_start_s=1.0, phases_s={}, overlap_factor=overlap_factor
    )
    times = [0.0] * arrivals
    return simulator.simulate("knative", values, prof, trace.Trace(times, [10] * arrivals, "test")).latencies


def test_a_pod_of_two_workers_runs_a_second_call_beside_the_first_at_the_overlap_factor():
    # The first finds the pod idle (the predictor's solo worker: its time alone); the second runs
    # beside it on a worker, the third when a worker is free; one worker runs them in turn.
    assert _worker_latencies(3, workers=2, overlap_factor=1.5) == [1.0, 1.5, 2.5]
    assert _worker_latencies(3, workers=1, overlap_factor=1.5) == [1.0, 2.0, 3.0]


def test_a_profile_that_never_measured_overlap_keeps_a_pod_of_workers_to_one_call_at_a_time():
    assert _worker_latencies(2, workers=2, overlap_factor=0.0) == [1.0, 2.0]


@pytest.mark.parametrize(
    ("env", "limits", "want"),
    [
        ({"ENGINE_WORKERS": "2"}, {"cpu": "2"}, 2),
        ({"ENGINE_WORKERS": "2"}, {"cpu": "1"}, 1),  # the e2e overlays' 1-CPU pods run one
        ({"ENGINE_WORKERS": "2"}, {"cpu": "1500m"}, 1),  # a quota rounds down, as container_cpus
        ({"ENGINE_WORKERS": "4", "CPU_THREADS": "2"}, {"cpu": "8"}, 2),  # CPU_THREADS wins over the quota
        ({}, {"cpu": "2"}, 1),  # Settings' default
    ],
)
def test_a_pods_engine_workers_are_resolved_as_the_predictor_resolves_them(env, limits, want):
    assert settings.engine_workers(env, limits) == want


def test_the_cpu_overlays_pods_run_two_workers_and_the_e2e_ones_one():
    def workers(overlay: str) -> int:
        return settings.from_manifests(ROOT / overlay)[1]["pod.engine_workers"]

    assert workers("knative/overlays/cpu") == workers("keda/overlays/cpu") == 2
    assert workers("knative/overlays/e2e") == workers("keda/overlays/e2e") == 1


def test_a_cpu_limit_that_is_no_quantity_is_bad_input_naming_it():
    with pytest.raises(SimulateError, match="'two'"):
        settings.engine_workers({"ENGINE_WORKERS": "2"}, {"cpu": "two"})
