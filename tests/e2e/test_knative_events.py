"""CloudEvents on real Knative Eventing (issue 22, `make e2e` test 5): the knative flavour's Broker
(channel-based, on InMemoryChannel) and Trigger as shipped. An event sent to the Broker while the
predictor is at zero wakes it, and the reply event reaches a sink subscribed to the reply type; an
event the predictor refuses for good (output outside CE_OUTPUT_PREFIXES, 403) is not retried and lands
in the dead-letter Broker; one delivered twice writes its audio once.

The sink is a pod of our image running a few lines of Python that log each event it receives as one
JSON line; it and its Triggers are this test's, not the overlay's."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest

from testing.bodies import cloudevent_headers
from testing.kube import (
    NAMESPACE,
    at_zero,
    condition_true,
    eventually,
    one_container_deployment,
    port_forward,
    stable_pods,
    timestamp,
)
from testing.predictor import metric_in

REQUEST_TYPE = "dev.tts-predictor.synthesize.v1"
REPLY_TYPE = "dev.tts-predictor.synthesized.v1"
SINK = "tts-event-sink"
SINK_CODE = """
import http.server, json
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        ce = {k.lower()[3:]: v for k, v in self.headers.items() if k.lower().startswith("ce-")}
        data = json.loads(body) if body[:1] == b"{" else None
        if isinstance(data, dict) and "audio_base64" in data:
            data["audio_base64"] = len(data["audio_base64"])
        print(json.dumps({"ce": ce, "data": data, "at": __import__("time").time()}), flush=True)
        self.send_response(202)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", 8080), Sink).serve_forever()
"""


def _sink_objects() -> list[dict[str, Any]]:
    labels = {"app": SINK}
    sink_ref = {"ref": {"apiVersion": "v1", "kind": "Service", "name": SINK}}
    return [
        one_container_deployment(
            SINK,
            {
                "name": "sink",
                "image": "dev.local/tts-predictor:e2e",
                "imagePullPolicy": "Never",
                "command": ["python", "-c", SINK_CODE],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
            },
        ),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SINK, "namespace": NAMESPACE},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        {
            "apiVersion": "eventing.knative.dev/v1",
            "kind": "Trigger",
            "metadata": {"name": "tts-replies-to-sink", "namespace": NAMESPACE},
            "spec": {
                "broker": "default",
                "filter": {"attributes": {"type": REPLY_TYPE}},
                "subscriber": sink_ref,
            },
        },
        {
            "apiVersion": "eventing.knative.dev/v1",
            "kind": "Trigger",
            "metadata": {"name": "tts-dead-letters-to-sink", "namespace": NAMESPACE},
            "spec": {"broker": "tts-dead-letters", "subscriber": sink_ref},
        },
    ]


@pytest.fixture(scope="module")
def bus(cluster, knative):
    """The sink and its Triggers ready, and a port-forward to the Broker's ingress; yields post(event)."""
    out = cluster.kubectl("apply", "-f", "-", input_text="\n".join(json.dumps(o) for o in _sink_objects()))
    assert out.returncode == 0, out.stderr
    assert (
        cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", f"deployment/{SINK}", "--timeout=180s"
        ).returncode
        == 0
    )
    for trigger in ("tts-synthesize", "tts-replies-to-sink", "tts-dead-letters-to-sink"):
        eventually(
            f"Trigger {trigger} Ready",
            lambda t=trigger: condition_true(cluster.get("-n", NAMESPACE, "trigger", t) or {}, "Ready"),
            120,
        )
    ingress = cluster.pods("knative-eventing", "eventing.knative.dev/brokerRole=ingress")[0]["metadata"][
        "name"
    ]
    with port_forward(cluster, "knative-eventing", ingress, 8080) as url:

        def post(data: dict[str, Any], event_id: str) -> httpx.Response:
            return httpx.post(
                f"{url}/{NAMESPACE}/default",
                headers=cloudevent_headers(event_id, source="/e2e"),
                content=json.dumps(data),
                timeout=30,
            )

        yield post
    cluster.kubectl("delete", "-f", "-", input_text="\n".join(json.dumps(o) for o in _sink_objects()))


def _received(cluster) -> list[dict[str, Any]]:
    (pod,) = [p for p in cluster.pods(NAMESPACE, f"app={SINK}") if not p["metadata"].get("deletionTimestamp")]
    logs = cluster.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"]).stdout
    return [json.loads(line) for line in logs.splitlines() if line.startswith("{")]


def _reply_to(cluster, event_id: str) -> list[dict[str, Any]]:
    return [
        e
        for e in _received(cluster)
        if e["ce"].get("type") == REPLY_TYPE and e["ce"].get("inreplyto") == event_id
    ]


def test_an_event_at_zero_wakes_the_predictor_and_its_reply_reaches_the_reply_sink(cluster, bus, e2e_report):
    eventually("the stable predictor at zero", lambda: at_zero(cluster), 300)
    event_id = f"wake-{uuid.uuid4().hex[:8]}"
    sent = time.time()
    accepted = bus({"text": "An event woke me from zero."}, event_id)

    assert accepted.status_code == 202, accepted.text
    (reply,) = eventually("the reply at the sink", lambda: _reply_to(cluster, event_id), 180)
    assert reply["data"]["format"] == "wav" and 1.0 < reply["data"]["audio_seconds"] < 5.0, reply["data"]
    assert reply["data"]["audio_base64"] > 20_000, "the audio rides in the reply"
    # A pod started for it: the event, not something else, woke the predictor.
    (pod,) = stable_pods(cluster)
    assert timestamp(pod["metadata"]["creationTimestamp"]) >= sent - 1
    e2e_report["knative event 0->reply_s"] = reply["at"] - sent


def test_an_event_refused_for_good_is_not_retried_and_lands_in_the_dead_letter_broker(cluster, bus):
    event_id = f"refused-{uuid.uuid4().hex[:8]}"
    # 403 before storage is touched: outside CE_OUTPUT_PREFIXES (s3://tts-events/outputs).
    accepted = bus({"text": "Nowhere to go.", "output": "s3://tts-events/elsewhere/x.wav"}, event_id)
    assert accepted.status_code == 202, accepted.text

    def dead() -> list[dict[str, Any]]:
        return [
            e
            for e in _received(cluster)
            if e["ce"].get("id") == event_id and e["ce"].get("type") == REQUEST_TYPE
        ]

    (letter,) = eventually("the event at the dead-letter sink", dead, 120)
    # Eventing says why it gave up: the subscriber's status and where it was delivered.
    assert letter["ce"].get("knativeerrorcode") == "403", letter["ce"]
    assert "tts-predictor" in letter["ce"].get("knativeerrordest", ""), letter["ce"]
    assert letter["data"] == {"text": "Nowhere to go.", "output": "s3://tts-events/elsewhere/x.wav"}
    assert not _reply_to(cluster, event_id)


def test_an_event_delivered_twice_writes_its_audio_once(cluster, bus):
    from cluster.deploy import S3_HOST_PORT
    from testing.s3 import s3_client

    event_id = f"twice-{uuid.uuid4().hex[:8]}"
    key = f"outputs/{event_id}.wav"
    data = {"text": "Written exactly once.", "output": f"s3://tts-events/{key}"}
    for _ in range(2):  # a producer's retry after a lost acknowledgement: same source and id
        assert bus(data, event_id).status_code == 202

    def both() -> list[dict[str, Any]] | None:
        replies = _reply_to(cluster, event_id)
        return replies if len(replies) == 2 else None

    replies = eventually("both replies at the sink", both, 180)

    assert replies[0]["data"] == replies[1]["data"] and replies[0]["ce"]["id"] == replies[1]["ce"]["id"]
    client = s3_client(f"http://127.0.0.1:{S3_HOST_PORT}")
    listed = client.list_objects_v2(Bucket="tts-events", Prefix="outputs/")
    audio = [o for o in listed.get("Contents", []) if o["Key"] == key]
    assert len(audio) == 1 and audio[0]["Size"] == replies[0]["data"]["bytes"]
    # The predictors' own count: one delivery synthesized and wrote, the other was answered from the
    # completion record (or joined the first while it was in flight) without writing.
    outcomes: dict[str, float] = {}
    for pod in stable_pods(cluster):
        exposition = cluster.pod_metrics(NAMESPACE, pod["metadata"]["name"])
        for outcome in ("written", "replayed", "joined", "raced", "recovered"):
            outcomes[outcome] = outcomes.get(outcome, 0) + metric_in(
                exposition, "tts_event_outputs_total", outcome=outcome
            )
    assert outcomes["written"] == 1 and outcomes["replayed"] + outcomes["joined"] == 1, outcomes


def test_an_event_whose_output_store_is_down_is_retried_as_the_trigger_says_then_dead_lettered(
    cluster, knative, bus
):
    # The shipped Trigger's policy (retry 10, exponential from 1 s: about 17 minutes) with its numbers
    # made test-sized: 2 linear retries with a 1 s delay (waits 0 s, then 1 s). Broken storage: the voice store's Service loses its one
    # endpoint (kube-proxy then refuses connections to it), so the predictor's upload is refused (503 "storage unreachable; retry later", which
    # Eventing retries, where the 403 above is not).
    route = "/v1/models/{model_name}:predict"
    trigger = cluster.get("-n", NAMESPACE, "trigger", "tts-synthesize")
    shipped = trigger["spec"]["delivery"]
    slice_name = "voice-store-node"
    endpoints = cluster.get("-n", NAMESPACE, "endpointslice", slice_name)
    assert endpoints is not None
    # A pod up before storage goes: one at zero could not fetch its voice.
    assert knative.infer("Awake before the store goes.").status_code == 200

    def merge(kind: str, name: str, patch: dict[str, Any]) -> None:
        out = cluster.kubectl("-n", NAMESPACE, "patch", kind, name, "--type=merge", "-p", json.dumps(patch))
        assert out.returncode == 0, out.stderr

    def refused() -> float:
        return sum(
            metric_in(cluster.pod_metrics(NAMESPACE, p["metadata"]["name"]), "tts_request_errors_total",
                      route=route, code="503")
            for p in stable_pods(cluster)
        )  # fmt: skip

    event_id = f"unstored-{uuid.uuid4().hex[:8]}"
    data = {"text": "Storage is down.", "output": f"s3://tts-events/outputs/{event_id}.wav"}
    try:
        merge(
            "trigger",
            "tts-synthesize",
            {"spec": {"delivery": {"retry": 2, "backoffPolicy": "linear", "backoffDelay": "PT1S"}}},
        )
        eventually(
            "the Trigger's new delivery spec taken",
            lambda: (t := cluster.get("-n", NAMESPACE, "trigger", "tts-synthesize") or {})
            .get("status", {}).get("observedGeneration") == t["metadata"]["generation"] and condition_true(t, "Ready"),
            60,
        )  # fmt: skip
        merge(
            "endpointslice",
            slice_name,
            {"endpoints": []},
        )
        before = refused()
        sent = time.time()
        assert bus(data, event_id).status_code == 202

        def dead() -> list[dict[str, Any]]:
            return [
                e
                for e in _received(cluster)
                if e["ce"].get("id") == event_id and e["ce"].get("type") == REQUEST_TYPE
            ]

        (letter,) = eventually("the event at the dead-letter sink", dead, 120)
        attempts = refused() - before
    finally:
        merge("endpointslice", slice_name, {"endpoints": endpoints["endpoints"]})
        merge("trigger", "tts-synthesize", {"spec": {"delivery": shipped}})

    assert letter["ce"].get("knativeerrorcode") == "503", letter["ce"]
    # The first delivery and the two retries, each refused by the predictor, then the dead letter.
    assert attempts == 3, f"{attempts} deliveries reached the predictor; the Trigger says 1 + 2 retries"
    # Linear backoff waits delay x n before retry n, and go-retryablehttp (which Eventing's dispatcher
    # drives) numbers the first retry 0 (eventing pkg/kncloudevents/retries.go, retryablehttp
    # client.go): 0 s, then 1 s. Sooner than 1 s, the retries did not wait as the Trigger says.
    assert letter["at"] - sent >= 1.0, "two linear retries 1 s apart cannot end sooner than 1 s"
    assert letter["data"] == data and not _reply_to(cluster, event_id)
