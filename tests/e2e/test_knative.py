"""The knative flavour on real Knative (issue 22, `make e2e` tests 1 to 4): knative/overlays/e2e deployed
with our image (`make cluster-deploy FLAVOUR=knative`) on Knative Serving with Kourier (cluster/knative.py),
KServe in Serverless mode. Ready through its Route and Kourier, then at zero; 0 -> 1 with the request
held by the activator; a burst that sends KPA into panic mode and scales out while containerConcurrency
holds at the pod; back to zero with a stream in flight that completes.

These run after every keda test (conftest orders them): deploying this flavour removes the other's."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from testing.bodies import v2_request
from testing.kube import (
    INFER,
    NAMESPACE,
    SENTENCE,
    at_zero,
    condition_true,
    eventually,
    ready,
    stable_pods,
    stream_while_its_pod_is_deleted,
    timestamp,
    wake_from_zero,
)
from testing.predictor import metric_in
from testing.process import REPO
from tts_ops.simulate import settings

SERVICE = "tts-predictor"  # the Knative Service KServe makes for InferenceService tts
# As the deployed overlay renders it (knative/overlays/cpu sets it, e2e inherits it).
CONTAINER_CONCURRENCY = settings.read(REPO / "knative/overlays/e2e").values["kpa.container_concurrency"]


def _revision(cluster) -> str:
    """The revision serving now (earlier runs of test_knative_timeout leave older ones behind)."""
    return (cluster.get("-n", NAMESPACE, "ksvc", SERVICE) or {})["status"]["latestReadyRevisionName"]


def _sks(cluster) -> dict[str, Any]:
    return cluster.get("-n", NAMESPACE, "serverlessservice", _revision(cluster)) or {}


def test_knative_the_inferenceservice_is_ready_through_its_route_and_kourier_then_at_zero(cluster, knative):
    isvc = cluster.get("-n", NAMESPACE, "inferenceservice", "tts")
    ksvc = cluster.get("-n", NAMESPACE, "ksvc", SERVICE)
    ingress = cluster.get("-n", NAMESPACE, "ingress.networking.internal.knative.dev", SERVICE)

    assert condition_true(isvc, "Ready") and condition_true(ksvc, "RoutesReady"), ksvc["status"]
    assert ingress["metadata"]["annotations"]["networking.knative.dev/ingress.class"] == (
        "kourier.ingress.networking.knative.dev"
    )
    assert condition_true(ingress, "Ready")
    assert knative.host == ksvc["status"]["url"].split("://", 1)[1]
    assert at_zero(cluster), [p["metadata"]["name"] for p in stable_pods(cluster)]
    # At zero the revision's public Service points at the activator: it is the one to hold a request.
    assert _sks(cluster)["spec"]["mode"] == "Proxy"


def test_knative_a_request_at_zero_is_held_by_the_activator_and_answered_with_real_speech(
    cluster, knative, e2e_report
):
    # The activator held the request until the pod was ready: the pod saw one inference, answered
    # 200, and never refused one as not ready (503).
    e2e_report["knative 0->1"] = wake_from_zero(
        cluster, lambda text: knative.infer(text, timeout=180), SENTENCE
    )


def test_knative_a_burst_sends_kpa_into_panic_and_scales_out_while_container_concurrency_holds(
    cluster, knative, e2e_report
):
    # Twelve callers in a loop: several times containerConcurrency on one pod, at once (a burst,
    # which the 6-second panic window sees before the stable one).
    clients, deadline_s = 12, 150.0
    answers: list[int] = []
    sends: list[float] = []  # when each request left, for the simulator's replay (test_knative_simulator)
    in_flight: list[float] = []  # the predictor's own gauge, sampled on every ready pod
    desired: list[tuple[float, int]] = []  # (seconds into the burst, the PodAutoscaler's desiredScale)
    stop = threading.Event()
    kpa_name = _revision(cluster)

    def caller() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                sends.append(time.time() - started)
                response = client.post(
                    knative.url + INFER.format(model_name="tts"),
                    headers={"Host": knative.host},
                    json=v2_request(SENTENCE),
                )
                answers.append(response.status_code)

    def watch() -> None:
        while not stop.is_set():
            kpa = cluster.get("-n", NAMESPACE, "podautoscaler", kpa_name) or {}
            desired.append((time.time() - started, int(kpa.get("status", {}).get("desiredScale") or 0)))
            for pod in [p for p in stable_pods(cluster) if ready(p)]:
                exposition = cluster.pod_metrics(NAMESPACE, pod["metadata"]["name"])
                in_flight.append(metric_in(exposition, "tts_in_flight_requests"))
            time.sleep(0.5)

    # The pod the test before woke may still serve (retention): the simulator must start where the
    # burst did.
    ready_at_start = len([p for p in stable_pods(cluster) if ready(p)])
    started = time.time()
    threads = [threading.Thread(target=caller) for _ in range(clients)]
    watcher = threading.Thread(target=watch)
    for t in [*threads, watcher]:
        t.start()
    try:
        eventually(
            "a second ready predictor pod",
            lambda: len([p for p in stable_pods(cluster) if ready(p)]) >= 2,
            deadline_s,
        )
        scaled_out = time.time() - started
        # The cold start of the pods the burst started, beside a busy one (test_simulator says why).
        started_under_load = [
            cluster.model_ready(NAMESPACE, p["metadata"]["name"])["cold_start_s"]
            for p in stable_pods(cluster)
            if ready(p) and timestamp(p["metadata"]["creationTimestamp"]) >= started - 1
        ]
    finally:
        stop.set()
        for t in threads:
            t.join(150)
        watcher.join(60)

    autoscaler = cluster.kubectl(
        "-n", "knative-serving", "logs", "deployment/autoscaler", "--since=5m"
    ).stdout
    panicked = [line for line in autoscaler.splitlines() if "PANICKING" in line and kpa_name in line]
    assert panicked, "KPA never entered panic mode for the burst"
    assert set(answers) == {200}, {c: answers.count(c) for c in set(answers)}
    # The queue-proxy's breaker: never more than containerConcurrency at the pod, and the burst did
    # fill it (a gauge that never reached the limit would prove nothing).
    assert max(in_flight) <= CONTAINER_CONCURRENCY, max(in_flight)
    assert CONTAINER_CONCURRENCY in in_flight, sorted(set(in_flight))
    e2e_report["knative 1->N"] = {
        "clients": clients,
        "ready_at_start": ready_at_start,
        "second_pod_ready_s": scaled_out,
        "first_desired_above_one_s": next((t for t, n in desired if n > 1), None),
        "max_desired": max((n for _, n in desired), default=0),
        "max_in_flight_at_a_pod": max(in_flight),
        "cold_start_under_load_s": started_under_load,
        "answers": {str(c): answers.count(c) for c in sorted(set(answers))},
    }
    e2e_report["knative 1->N trace"] = {"t": sorted(sends), "chars": len(SENTENCE)}


def test_knative_a_stream_in_flight_on_a_pod_being_removed_completes_then_back_to_zero(
    cluster, knative, e2e_report
):
    # Right after the burst several pods are up and KPA is scaling them down. Scale-down and `kubectl
    # delete pod` end a pod the same way (SIGTERM to queue-proxy and the predictor, the grace period),
    # so the pod serving the stream is deleted: queue-proxy's drain and ours must let it finish.
    streamed = stream_while_its_pod_is_deleted(cluster, knative.url, knative.host, " ".join([SENTENCE] * 20))

    assert streamed["status"] == 200
    # Twenty sentences of about 2.6 s: a stream cut at SIGTERM would stop far short.
    assert streamed["audio_s"] > 20 * 1.5, f"{streamed['audio_s']:.1f} s of audio: the stream was cut off"
    e2e_report["knative stream_after_sigterm_s"] = streamed["after_delete_s"]
    idle_since = time.time()
    eventually("zero replicas once idle", lambda: at_zero(cluster), 300)
    e2e_report["knative 1->0_s"] = time.time() - idle_since
