"""Tests 2 to 6 of `make e2e` (issue 21): the keda flavour's e2e overlay deployed with our image
(`make cluster-deploy FLAVOUR=keda`), scaled 0 -> 1 by a request through the HTTP add-on's interceptor,
1 -> N by load, the pod as shipped, and back to 0, with a streamed request surviving its pod's SIGTERM.

Evidence comes from the cluster (pod status, events, the pod's own /metrics through the API server's
pod proxy and its log); figures go to the e2e report (conftest.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from testing.bodies import v2_request
from testing.kube import (
    NAMESPACE,
    SENTENCE,
    STABLE_DEPLOYMENT,
    at_zero,
    eventually,
    ready,
    stable_pods,
    stream_while_its_pod_is_deleted,
    timestamp,
    wake_from_zero,
)

SPEECH = "/v1/audio/speech"


def test_at_rest_the_scaledobject_holds_the_predictor_at_zero(cluster, keda):
    assert at_zero(cluster), [p["metadata"]["name"] for p in stable_pods(cluster)]
    hpa = cluster.get("-n", NAMESPACE, "hpa", "keda-hpa-tts-predictor")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "tts-predictor"


def test_a_request_at_zero_wakes_one_pod_and_gets_real_speech(cluster, keda, e2e_report):
    # The pod's only inference is ours, answered 200: nothing reached it before it was ready (it
    # would have been refused 503, cold start) and the interceptor did not retry.
    e2e_report["0->1"] = wake_from_zero(cluster, lambda text: keda.infer(text, timeout=180), SENTENCE)


def test_load_above_one_pods_capacity_scales_out_and_every_answer_is_200_or_503_retry_after(
    cluster, keda, e2e_report
):
    # Eight callers in a loop on a pod of one core: about eight times what it serves at once, and
    # above both triggers' per-pod targets (3 in flight at the interceptor, 4 queued at the pod).
    clients, deadline_s = 8, 150.0
    answers: list[tuple[int, str | None]] = []
    sends: list[float] = []  # when each request left, for the simulator's replay (test_simulator)
    replicas: list[tuple[float, int]] = []  # (seconds into the load, the Deployment's replicas)
    stop = threading.Event()

    def caller() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                sends.append(time.time() - started)
                response = client.post(
                    keda.url + "/v2/models/tts/infer", headers={"Host": keda.host}, json=v2_request(SENTENCE)
                )
                answers.append((response.status_code, response.headers.get("retry-after")))

    def ready_pods() -> list[dict[str, Any]]:
        return [p for p in stable_pods(cluster) if ready(p)]

    def watch_replicas() -> None:
        # The Deployment's replica count as KEDA's HPA sets it, during the load and 15 s after.
        after = 0
        while after < 15:
            deployment = cluster.get("-n", NAMESPACE, "deployment", STABLE_DEPLOYMENT) or {}
            replicas.append((time.time() - started, int(deployment.get("spec", {}).get("replicas") or 0)))
            after += stop.is_set()
            time.sleep(1.0)

    # The pod the test before woke may still serve: the simulator must start where the load did.
    ready_at_start = len(ready_pods())
    started = time.time()
    threads = [threading.Thread(target=caller) for _ in range(clients)]
    watcher = threading.Thread(target=watch_replicas)
    for t in [*threads, watcher]:
        t.start()
    try:
        second = eventually(
            "a second ready predictor pod under load", lambda: len(ready_pods()) >= 2, deadline_s
        )
        scaled_out = time.time() - started
        most = max(len(ready_pods()), 2)
        # The cold start of the pods the load started, on a node busy with the first pod and the load.
        started_under_load = [
            cluster.model_ready(NAMESPACE, p["metadata"]["name"])["cold_start_s"]
            for p in ready_pods()
            if timestamp(p["metadata"]["creationTimestamp"]) >= started - 1
        ]
    finally:
        stop.set()
        for t in threads:
            t.join(150)
        load_s = time.time() - started
        watcher.join(60)

    codes = [code for code, _ in answers]
    assert second and codes.count(200) > 0
    assert set(codes) <= {200, 503}, sorted(set(codes))
    assert all(retry for code, retry in answers if code == 503), "a 503 without Retry-After"
    e2e_report["1->N"] = {
        "clients": clients,
        "ready_at_start": ready_at_start,
        "second_pod_ready_s": scaled_out,
        "ready_pods_seen": most,
        "max_replicas": max((n for _, n in replicas), default=0),
        # When the HPA first asked for more than one pod (the watcher's 1 s resolution): the phase
        # of its 15 s sync against the load, which test_simulator gives the simulator.
        "first_scale_up_s": next((t for t, n in replicas if n > 1), None),
        "load_s": load_s,
        "cold_start_under_load_s": started_under_load,
        "answers": {str(c): codes.count(c) for c in sorted(set(codes))},
    }
    e2e_report["1->N trace"] = {"t": sorted(sends), "chars": len(SENTENCE)}


def test_the_pod_runs_as_shipped(cluster, keda):
    # The first test woke a pod; one is still up within the cooldown.
    pod = eventually("a predictor pod", lambda: next(iter(stable_pods(cluster)), None), 120)
    spec = pod["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "kserve-container"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsUser"] == 10001 and security["runAsNonRoot"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["allowPrivilegeEscalation"] is False
    model_dir = next(e["value"] for e in container["env"] if e["name"] == "MODEL_DIR")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == model_dir)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"]["sizeLimit"] == "1Gi"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/models/tts/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # What the process itself sees: uid 10001, no capability, / read-only, the voice in MODEL_DIR.
    name = pod["metadata"]["name"]
    status = cluster.kubectl(
        "-n", NAMESPACE, "exec", name, "-c", "kserve-container", "--", "cat", "/proc/self/status"
    )
    assert status.returncode == 0, status.stderr
    fields = dict(line.split(":\t", 1) for line in status.stdout.splitlines() if ":\t" in line)
    assert fields["Uid"].split()[0] == "10001"
    assert int(fields["CapEff"], 16) == 0
    touch = cluster.kubectl("-n", NAMESPACE, "exec", name, "--", "python", "-c", "open('/x', 'w')")
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr


def test_idle_the_predictor_returns_to_zero(cluster, keda, e2e_report):
    idle_since = time.time()
    eventually("zero replicas after the load", lambda: at_zero(cluster), 300)
    e2e_report["1->0_s"] = time.time() - idle_since


def test_a_streamed_request_in_flight_when_its_pod_is_stopped_completes(cluster, keda, e2e_report):
    # The drain must let a stream finish (testing.kube.stream_while_its_pod_is_deleted says how).
    streamed = stream_while_its_pod_is_deleted(cluster, keda.url, keda.host, " ".join([SENTENCE] * 12))

    assert streamed["status"] == 200
    # Twelve sentences of about 2.6 s: a stream cut at SIGTERM would stop far short.
    assert streamed["audio_s"] > 12 * 1.5, f"{streamed['audio_s']:.1f} s of audio: the stream was cut off"
    e2e_report["stream_after_sigterm_s"] = streamed["after_delete_s"]
