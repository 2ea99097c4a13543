"""Tests 2, 3, 5 and 6 of `make e2e` (issue 21): the keda flavour's e2e overlay deployed with our image
(`make cluster-deploy FLAVOUR=keda`), scaled 0 -> 1 by a request through the HTTP add-on's interceptor,
the pod as shipped, and back to 0, with a streamed request surviving its pod's SIGTERM.

Evidence comes from the cluster (pod status, events, the pod's own /metrics through the API server's
pod proxy and its log); figures go to the e2e report (conftest.py)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Any

import httpx
import pytest

from testing.audio import speech_problems
from testing.bodies import audio_of, speech_request, v2_request
from testing.predictor import metric_in

NAMESPACE = "tts"
STABLE = "serving.kserve.io/inferenceservice=tts"
SENTENCE = "The quick brown fox jumps over the lazy dog."
INFER = "/v2/models/{model_name}/infer"
SPEECH = "/v1/audio/speech"
SAMPLE_RATE = 22050  # the default voice's


def _get(cluster, *args: str) -> dict[str, Any]:
    out = cluster.kubectl("get", *args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _pods(cluster, selector: str = STABLE) -> list[dict[str, Any]]:
    return _get(cluster, "-n", NAMESPACE, "pods", "-l", selector)["items"]


def _eventually(what: str, probe, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _condition_time(pod: dict[str, Any], kind: str) -> float | None:
    for c in pod["status"].get("conditions", []):
        if c["type"] == kind and c["status"] == "True":
            return _time(c["lastTransitionTime"])
    return None


def _pod_metrics(cluster, pod: str) -> str:
    out = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:8080/proxy/metrics")
    assert out.returncode == 0, out.stderr
    return out.stdout


def _model_ready_line(cluster, pod: str) -> dict[str, Any]:
    logs = cluster.kubectl("-n", NAMESPACE, "logs", pod).stdout
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    return next(line for line in lines if line.get("msg") == "model ready")


def _at_zero(cluster) -> bool:
    deployment = _get(cluster, "-n", NAMESPACE, "deployment", "tts-predictor")
    return deployment["spec"].get("replicas") == 0 and not _pods(cluster)


def test_at_rest_the_scaledobject_holds_the_predictor_at_zero(cluster, keda):
    assert _at_zero(cluster), [p["metadata"]["name"] for p in _pods(cluster)]
    hpa = _get(cluster, "-n", NAMESPACE, "hpa", "keda-hpa-tts-predictor")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "tts-predictor"


def test_a_request_at_zero_wakes_one_pod_and_gets_real_speech(cluster, keda, e2e_report):
    assert _at_zero(cluster), "not at zero before the first request"
    sent = time.time()
    response = httpx.post(
        keda.url + "/v2/models/tts/infer",
        headers={"Host": keda.host},
        json=v2_request(SENTENCE),
        timeout=180,
    )
    answered = time.time()

    assert response.status_code == 200, response.text[:500]
    audio = audio_of(response.json())
    seconds = len(audio) / SAMPLE_RATE
    assert 1.5 < seconds < 5.0, f"{seconds:.2f} s of audio for a 44-character sentence"
    assert speech_problems(audio, SAMPLE_RATE, seconds) == []

    (pod,) = _pods(cluster)
    name = pod["metadata"]["name"]
    started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    ready_line = _model_ready_line(cluster, name)
    exposition = _pod_metrics(cluster, name)
    # The pod's only inference was ours, answered 200: nothing reached it before it was ready (it
    # would have been refused 503, cold start) and the interceptor did not retry.
    assert metric_in(exposition, "tts_requests_total", route=INFER, code="200") == 1
    assert metric_in(exposition, "tts_request_errors_total", route=INFER, code="503") == 0
    created = _time(pod["metadata"]["creationTimestamp"])
    timeline = {
        "pod_created_s": created - sent,
        "scheduled_s": (_condition_time(pod, "PodScheduled") or created) - sent,
        "container_started_s": _time(started) - sent,
        "ready_s": (_condition_time(pod, "Ready") or answered) - sent,
        "answered_s": answered - sent,
        "predictor_cold_start_s": ready_line["cold_start_s"],
        "predictor_phases_s": ready_line["phases_s"],
    }
    e2e_report["0->1"] = timeline
    # Kubernetes timestamps have whole seconds: allow one either side.
    assert timeline["pod_created_s"] <= timeline["ready_s"] + 1 <= timeline["answered_s"] + 2, timeline


def test_the_pod_runs_as_shipped(cluster, keda):
    # The first test woke a pod; one is still up within the cooldown.
    pod = _eventually("a predictor pod", lambda: next(iter(_pods(cluster)), None), 120)
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
    _eventually("zero replicas after the load", lambda: _at_zero(cluster), 300)
    e2e_report["1->0_s"] = time.time() - idle_since


def test_a_streamed_request_in_flight_when_its_pod_is_stopped_completes(cluster, keda, e2e_report):
    # Scale-down and `kubectl delete pod` end a pod the same way: the kubelet sends SIGTERM and waits
    # the grace period; the drain must let the stream finish. Deleting the pod makes it this one.
    text = " ".join([SENTENCE] * 12)
    chunks: list[bytes] = []
    result: dict[str, Any] = {}

    def stream() -> None:
        with httpx.stream(
            "POST",
            keda.url + SPEECH,
            headers={"Host": keda.host},
            json=speech_request(text, stream=True),
            timeout=180,
        ) as response:
            result["status"] = response.status_code
            for chunk in response.iter_raw():
                chunks.append(chunk)
        result["done"] = time.time()

    caller = threading.Thread(target=stream)
    caller.start()
    _eventually("the stream's first audio", lambda: chunks, 180)
    (pod,) = _pods(cluster)
    deleted = time.time()
    out = cluster.kubectl("-n", NAMESPACE, "delete", "pod", pod["metadata"]["name"], "--wait=false")
    assert out.returncode == 0, out.stderr
    caller.join(120)

    assert result.get("status") == 200
    pcm = b"".join(chunks)
    seconds = len(pcm) / 2 / SAMPLE_RATE
    # Twelve sentences of about 2.6 s: a stream cut at SIGTERM would stop far short.
    assert seconds > 12 * 1.5, f"{seconds:.1f} s of audio: the stream was cut off"
    e2e_report["stream_after_sigterm_s"] = result["done"] - deleted
