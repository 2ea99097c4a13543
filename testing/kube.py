"""The cluster of `make cluster` as the e2e tests see it: kubectl with its kubeconfig, and the reads they
share (objects as JSON, a namespace's pods, a pod's /metrics through the API server's pod proxy, pod
conditions). Only 127.0.0.1 is ever addressed: the API server's loopback port."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Cluster:
    kubectl_path: str
    kubeconfig: str

    def kubectl(
        self, *args: str, input_text: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def get(self, *args: str) -> dict[str, Any] | None:
        """`kubectl get ARGS -o json`, or None where it fails (not found)."""
        out = self.kubectl("get", *args, "-o", "json")
        return json.loads(out.stdout) if out.returncode == 0 else None

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        found = self.get("-n", namespace, "pods", "-l", selector)
        assert found is not None, f"cannot list pods {selector} in {namespace}"
        return list(found["items"])

    def pod_metrics(self, namespace: str, pod: str, port: int = 8080) -> str:
        """The pod's /metrics page, fetched by the API server (which reaches pod IPs; we do not)."""
        out = self.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics")
        assert out.returncode == 0, out.stderr
        return out.stdout

    def json_logs(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        # Knative pods carry queue-proxy beside it: name the predictor's container.
        logs = self.kubectl("-n", namespace, "logs", pod, "-c", "kserve-container").stdout
        return [json.loads(line) for line in logs.splitlines() if line.startswith("{")]

    def model_ready(self, namespace: str, pod: str) -> dict[str, Any]:
        """The predictor's "model ready" log line (its cold start and phases) in the pod's log."""
        (line,) = [line for line in self.json_logs(namespace, pod) if line.get("msg") == "model ready"]
        return line


def eventually(what: str, probe: Callable[[], T], timeout: float, every: float = 0.5) -> T:
    """The first truthy value of probe(), polled; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def timestamp(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def condition_true(obj: dict[str, Any], kind: str) -> bool:
    """Condition `kind` is True (KEDA's conditions carry no lastTransitionTime)."""
    return any(
        c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", [])
    )


def condition_time(obj: dict[str, Any], kind: str) -> float | None:
    """When condition `kind` last became True (None: it is not True)."""
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind and c["status"] == "True":
            return timestamp(c["lastTransitionTime"])
    return None


def ready(pod: dict[str, Any]) -> bool:
    return condition_time(pod, "Ready") is not None and not pod["metadata"].get("deletionTimestamp")


# What our manifests name: the namespace, and the stable predictor's pods and Deployment (KServe names
# the Deployment of InferenceService tts `tts-predictor` in Standard mode).
NAMESPACE = "tts"
STABLE = "serving.kserve.io/inferenceservice=tts"
STABLE_DEPLOYMENT = "tts-predictor"


def stable_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.pods(NAMESPACE, STABLE)


def at_zero(cluster: Cluster) -> bool:
    """The stable predictor scaled to zero replicas, with no pod left (a terminating one counts).

    Its Deployment is KServe's (Standard mode, keda flavour) or, in Serverless mode (knative flavour),
    the Knative revisions' (<service>-<n>-deployment, labelled with the InferenceService)."""
    deployment = cluster.get("-n", NAMESPACE, "deployment", STABLE_DEPLOYMENT)
    if deployment is not None:
        deployments = [deployment]
    else:
        deployments = (cluster.get("-n", NAMESPACE, "deployment", "-l", STABLE) or {}).get("items", [])
    return (
        bool(deployments)
        and all(d["spec"].get("replicas") == 0 for d in deployments)
        and not stable_pods(cluster)
    )


@contextlib.contextmanager
def port_forward(cluster: Cluster, namespace: str, pod: str, port: int) -> Iterator[str]:
    """`kubectl port-forward` of the pod's `port` to a free port on 127.0.0.1; yields its URL."""
    from testing.ports import free_port

    local = free_port()
    proc = subprocess.Popen(
        [cluster.kubectl_path, f"--kubeconfig={cluster.kubeconfig}", "-n", namespace, "port-forward",
         "--address", "127.0.0.1", f"pod/{pod}", f"{local}:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:N -> port" once it listens
        assert "Forwarding from" in line, line
        yield f"http://127.0.0.1:{local}"
    finally:
        proc.terminate()
        proc.wait(10)


SAMPLE_RATE = 22050  # the default voice's
INFER = "/v2/models/{model_name}/infer"
# The sentence every e2e request sends (44 characters): profiles, traces and replays are timed on it.
SENTENCE = "The quick brown fox jumps over the lazy dog."


def wake_from_zero(cluster: Cluster, infer: Callable[[str], Any], text: str) -> dict[str, Any]:
    """One request at zero through a flavour's path (`infer(text)` -> its response), checked as both
    flavours' 0 -> 1 tests check it: 200 with real speech, one pod woken, and that pod's only inference
    ours, answered 200 and never refused 503 (the interceptor or the activator held it until the pod
    was ready). Returns the timeline in seconds from the send, with the pod's cold start and phases."""
    from testing.audio import speech_problems
    from testing.bodies import audio_of
    from testing.predictor import metric_in

    assert at_zero(cluster), "not at zero before the first request"
    sent = time.time()
    response = infer(text)
    answered = time.time()

    assert response.status_code == 200, response.text[:500]
    audio = audio_of(response.json())
    seconds = len(audio) / SAMPLE_RATE
    assert 1.5 < seconds < 5.0, f"{seconds:.2f} s of audio for {len(text)} characters"
    assert speech_problems(audio, SAMPLE_RATE, seconds) == []
    (pod,) = stable_pods(cluster)
    name = pod["metadata"]["name"]
    exposition = cluster.pod_metrics(NAMESPACE, name)
    assert metric_in(exposition, "tts_requests_total", route=INFER, code="200") == 1
    assert metric_in(exposition, "tts_request_errors_total", route=INFER, code="503") == 0
    return timeline(pod, sent, answered, cluster.model_ready(NAMESPACE, name))


def timeline(pod: dict[str, Any], sent: float, answered: float, ready_line: dict[str, Any]) -> dict[str, Any]:
    """A woken pod's steps in seconds from `sent` (Kubernetes timestamps have whole seconds)."""
    (container,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "kserve-container"]
    created = timestamp(pod["metadata"]["creationTimestamp"])
    steps = {
        "pod_created_s": created - sent,
        "scheduled_s": (condition_time(pod, "PodScheduled") or created) - sent,
        "container_started_s": timestamp(container["state"]["running"]["startedAt"]) - sent,
        "ready_s": (condition_time(pod, "Ready") or answered) - sent,
        "answered_s": answered - sent,
        "predictor_cold_start_s": ready_line["cold_start_s"],
        "predictor_phases_s": ready_line["phases_s"],
    }
    # Whole-second timestamps: allow one either side.
    assert steps["pod_created_s"] <= steps["ready_s"] + 1 <= steps["answered_s"] + 2, steps
    return steps


def one_container_deployment(
    name: str, container: dict[str, Any], volumes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A Deployment of one pod with one container, labelled app=<name>, in the flavours' namespace
    (the e2e tests' own helpers: an event sink, an Envoy)."""
    labels = {"app": name}
    spec: dict[str, Any] = {"containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def stream_while_its_pod_is_deleted(cluster: Cluster, url: str, host: str, text: str) -> dict[str, float]:
    """A streamed speech request through a flavour's path whose pod is deleted once audio flows.

    Scale-down and `kubectl delete pod` end a pod the same way (SIGTERM, then the grace period), so
    deleting the pod serving the stream (the ready one with a request in flight) tests the drain
    where it matters. Returns the HTTP status, the seconds of audio received and how long after the
    delete the stream ended."""
    import threading

    import httpx

    from testing.bodies import speech_request
    from testing.predictor import metric_in

    chunks: list[bytes] = []
    result: dict[str, float] = {}

    def stream() -> None:
        with httpx.stream(
            "POST",
            url + "/v1/audio/speech",
            headers={"Host": host},
            json=speech_request(text, stream=True),
            timeout=300,
        ) as response:
            result["status"] = response.status_code
            for chunk in response.iter_raw():
                chunks.append(chunk)
        result["done"] = time.time()

    def streaming_pod() -> str | None:
        for pod in stable_pods(cluster):
            name = pod["metadata"]["name"]
            if ready(pod) and metric_in(cluster.pod_metrics(NAMESPACE, name), "tts_in_flight_requests") >= 1:
                return name
        return None

    caller = threading.Thread(target=stream)
    caller.start()
    eventually("the stream's first audio", lambda: chunks, 180)
    name = eventually("the pod serving the stream", streaming_pod, 30)
    deleted = time.time()
    out = cluster.kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=false")
    assert out.returncode == 0, out.stderr
    caller.join(300)
    return {
        "status": result.get("status", 0),
        "audio_s": len(b"".join(chunks)) / 2 / SAMPLE_RATE,
        "after_delete_s": result.get("done", float("nan")) - deleted,
    }
