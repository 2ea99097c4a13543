"""knative/ and keda/ render, validate strictly, and agree with the running predictor."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tts_ops import kustomize, manifests
from tts_ops.manifests import OVERLAYS, Deployment, predictor_container, probes

LONG_TEXT = " ".join(
    ["The weights arrive, the engine warms up, and only then do we say that we are ready."] * 7
)


def _key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    assert manifests.schema_dir().is_dir(), (
        f"CRD schemas not found at {manifests.schema_dir()} (set SCHEMA_DIR)"
    )
    return manifests.render_all()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_validates_strictly(rendered, overlay):
    problems = list(manifests.problems_of(rendered[overlay]))

    assert problems == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_fallback_renderer_matches_kubectl(overlay):
    # kubectl comes with this project's machines; without it the fallback renderer would be unchecked.
    assert shutil.which("kubectl"), "kubectl is needed to check the fallback renderer against kustomize"

    with_kubectl = sorted(kustomize.render_with_kubectl(manifests.ROOT / overlay), key=_key)
    fallback = sorted(kustomize.render_kustomization(manifests.ROOT / overlay), key=_key)

    assert fallback == with_kubectl


def test_make_manifests_writes_one_file_per_overlay(tmp_path):
    written = manifests.write_rendered(tmp_path)

    assert sorted(p.name for p in written) == [
        "keda-cpu.yaml",
        "keda-gpu.yaml",
        "knative-cpu.yaml",
        "knative-gpu.yaml",
    ]
    assert not list(tmp_path.glob("*.tmp"))


def test_both_flavours_start_from_zero(rendered):
    knative = Deployment(rendered["knative/overlays/cpu"])
    keda = Deployment(rendered["keda/overlays/cpu"])

    assert knative.named("InferenceService", "tts")["spec"]["predictor"]["minReplicas"] == 0
    assert keda.named("ScaledObject", "tts-predictor")["spec"]["minReplicaCount"] == 0
    assert {t["type"] for t in keda.named("ScaledObject", "tts-predictor")["spec"]["triggers"]} == {
        "prometheus",
        "external-push",
        "kafka",
    }


def test_keda_replica_bound_is_the_inference_services_max_replicas(rendered):
    # Written once (deploy/common/predictor), copied by keda/predictor's replacements.
    for overlay in ("keda/overlays/cpu", "keda/overlays/gpu"):
        keda = Deployment(rendered[overlay])
        bound = keda.named("InferenceService", "tts")["spec"]["predictor"]["maxReplicas"]

        assert keda.named("ScaledObject", "tts-predictor")["spec"]["maxReplicaCount"] == bound
        assert keda.named("HTTPScaledObject", "tts-predictor")["spec"]["replicas"]["max"] == bound
        assert keda.named("InferenceService", "tts-canary")["spec"]["predictor"]["maxReplicas"] == 1


def test_gpu_overlays_ask_for_one_gpu_with_guaranteed_qos(rendered):
    for overlay in ("knative/overlays/gpu", "keda/overlays/gpu"):
        for isvc in Deployment(rendered[overlay]).kind("InferenceService"):
            resources = predictor_container(isvc)["resources"]

            assert resources["requests"] == resources["limits"], f"{overlay} {isvc['metadata']['name']}"
            assert resources["limits"]["nvidia.com/gpu"] == 1
            assert "nodeAffinity" in isvc["spec"]["predictor"]["affinity"]


# Each mutation breaks one rule; the validator must name it. Proves the checks can fail.
def _isvc(d: list[dict]) -> dict:
    return next(o for o in d if o["kind"] == "InferenceService" and o["metadata"]["name"] == "tts")


def _kind(kind: str) -> Callable[[list[dict]], dict]:
    return lambda d: next(o for o in d if o["kind"] == kind)


def _set(path: str, value) -> Callable[[dict], None]:
    def apply(obj: dict) -> None:
        kustomize.json_patch(obj, {"op": "add", "path": path, "value": value})

    return apply


def _remove(path: str) -> Callable[[dict], None]:
    return lambda obj: kustomize.json_patch(obj, {"op": "remove", "path": path})


MUTATIONS = [
    (
        "keda trigger name used twice",
        "keda/overlays/cpu",
        _kind("ScaledObject"),
        _set("/spec/triggers/1/name", "queue-depth"),
        "trigger name 'queue-depth' is used twice",
    ),
    (
        "keda replica bounds inverted",
        "keda/overlays/cpu",
        _kind("ScaledObject"),
        _set("/spec/minReplicaCount", 5),
        "minReplicaCount 5 is above maxReplicaCount",
    ),
    # One per domain whose keys the lint knows from upstream source (tts_ops/manifests.py KNOWN_KEYS).
    (
        "keda annotation typo",
        "keda/overlays/cpu",
        _kind("HTTPScaledObject"),
        _set("/metadata/annotations/httpscaledobject.keda.sh~1skip-scaledobject-creaton", "true"),
        "httpscaledobject.keda.sh/skip-scaledobject-creaton is not a key keda.sh defines",
    ),
    (
        "keda pause annotation typo",
        "keda/overlays/cpu",
        _kind("ScaledObject"),
        _set("/metadata/annotations", {"autoscaling.keda.sh/pause": "true"}),
        "autoscaling.keda.sh/pause is not a key keda.sh defines",
    ),
    (
        "knative serving annotation typo",
        "knative/overlays/cpu",
        _isvc,
        _set("/metadata/annotations/serving.knative.dev~1rollout-duraton", "60s"),
        "serving.knative.dev/rollout-duraton is not a key knative.dev defines",
    ),
    (
        "kserve label typo",
        "knative/overlays/cpu",
        _isvc,
        _set("/metadata/labels", {"serving.kserve.io/inference-service": "tts"}),
        "serving.kserve.io/inference-service is not a key serving.kserve.io defines",
    ),
    (
        "istio sidecar annotation typo",
        "knative/overlays/cpu",
        _isvc,
        _set("/metadata/annotations/sidecar.istio.io~1inejct", "false"),
        "sidecar.istio.io/inejct is not a key sidecar.istio.io defines",
    ),
    (
        "trigger spec typo under the open schema",
        "knative/overlays/cpu",
        _kind("Trigger"),
        _set("/spec/filtr", {"attributes": {"type": "x"}}),
        "Trigger spec.filtr is not a TriggerSpec field",
    ),
    (
        "spec field typo",
        "keda/overlays/cpu",
        _isvc,
        _set("/spec/predictor/minReplica", 0),
        "'minReplica' was unexpected",
    ),
    ("root typo", "knative/overlays/cpu", _isvc, _set("/specs", {}), "'specs' was unexpected"),
    (
        "metadata typo",
        "knative/overlays/cpu",
        _isvc,
        _set("/metadata/anotations", {}),
        "'anotations' was unexpected",
    ),
    (
        "annotation typo",
        "knative/overlays/cpu",
        _isvc,
        _set("/metadata/annotations/autoscaling.knative.dev~1scale-down-dealy", "1m"),
        "autoscaling.knative.dev/scale-down-dealy is not a key knative.dev defines",
    ),
    (
        "annotation value",
        "knative/overlays/cpu",
        _isvc,
        _set("/metadata/annotations/serving.kserve.io~1deploymentMode", "Raw"),
        "is not one of",
    ),
    (
        "core kind typo",
        "keda/overlays/cpu",
        _kind("PodDisruptionBudget"),
        _set("/spec/maxUnavailabel", 1),
        "'maxUnavailabel' was unexpected",
    ),
    (
        "KEDA metadata typo",
        "keda/overlays/cpu",
        _kind("ScaledObject"),
        _set("/spec/triggers/0/metadata/treshold", "4"),
        "unknown metadata key 'treshold'",
    ),
    (
        "KEDA unquoted number",
        "keda/overlays/cpu",
        _kind("ScaledObject"),
        _set("/spec/triggers/0/metadata/threshold", 4),
        "is not of type 'string'",
    ),
    (
        "trap: no trigger wakes it from zero",
        "keda/overlays/cpu",
        _kind("ScaledObject"),
        lambda o: o["spec"].update(triggers=o["spec"]["triggers"][:1]),
        "never scale up again",
    ),
    (
        "trap: mirror into scale-to-zero",
        "knative/overlays/cpu",
        _kind("VirtualService"),
        _set("/spec/http/0/mirror/host", "tts-predictor.tts.svc.cluster.local"),
        "can scale to zero",
    ),
    (
        "both mirror and mirrors",
        "knative/overlays/cpu",
        _kind("VirtualService"),
        _set("/spec/http/0/mirrors", [{"destination": {"host": "tts-canary-predictor"}}]),
        "both mirror and mirrors",
    ),
    (
        "storage-initializer",
        "knative/overlays/cpu",
        _isvc,
        _set("/spec/predictor/storageUri", "s3://voices/x"),
        "storage-initializer",
    ),
    (
        "MODEL_DIR not the emptyDir",
        "knative/overlays/cpu",
        _isvc,
        _set("/spec/predictor/containers/0/env/1/value", "/models"),
        "is not the mountPath of an emptyDir",
    ),
    (
        "drain outlasts the grace period",
        "keda/overlays/cpu",
        _isvc,
        _set("/spec/predictor/terminationGracePeriodSeconds", 30),
        "is not below the grace period",
    ),
    (
        "invalid setting",
        "knative/overlays/cpu",
        _isvc,
        _set("/spec/predictor/containers/0/env/-", {"name": "ENGINE", "value": "tensorrt"}),
        "env ENGINE",
    ),
    (
        "unknown setting",
        "knative/overlays/cpu",
        _isvc,
        _set("/spec/predictor/containers/0/env/-", {"name": "MAX_QUEUE_SIZE", "value": "8"}),
        "not a predictor setting",
    ),
    (
        "probe on an undeclared port",
        "knative/overlays/cpu",
        _isvc,
        _set("/spec/predictor/containers/0/readinessProbe/httpGet/port", 9000),
        "is not a container port",
    ),
    (
        "writable root filesystem",
        "knative/overlays/cpu",
        _isvc,
        _set("/spec/predictor/containers/0/securityContext/readOnlyRootFilesystem", False),
        "readOnlyRootFilesystem",
    ),
    (
        "trigger on the wrong type",
        "knative/overlays/cpu",
        _kind("Trigger"),
        _set("/spec/filter/attributes/type", "dev.tts-predictor.synthesize.v2"),
        "the predictor accepts",
    ),
    (
        "trigger on the reply type",
        "knative/overlays/cpu",
        _kind("Trigger"),
        _set("/spec/filter/attributes/type", "dev.tts-predictor.synthesized.v1"),
        "loop back forever",
    ),
    (
        "no dead-letter sink",
        "knative/overlays/cpu",
        _kind("Trigger"),
        _remove("/spec/delivery/deadLetterSink"),
        "no deadLetterSink",
    ),
    (
        "kafka consumer group",
        "keda/overlays/cpu",
        _kind("ScaledObject"),
        _set("/spec/triggers/2/metadata/consumerGroup", "tts"),
        "is no Trigger's group",
    ),
    (
        "kafka partitions below the replica bound",
        "keda/overlays/cpu",
        _kind("ConfigMap"),
        _set("/data/default.topic.partitions", "2"),
        "2 partitions cap the kafka trigger below maxReplicaCount 4",
    ),
    (
        "HTTP add-on's own ScaledObject",
        "keda/overlays/cpu",
        _kind("HTTPScaledObject"),
        _set("/metadata/annotations", {}),
        "second ScaledObject",
    ),
    (
        "Knative knob in Standard mode",
        "keda/overlays/cpu",
        _isvc,
        _set("/metadata/annotations/autoscaling.knative.dev~1target", "4"),
        "no effect outside Serverless",
    ),
    (
        "canary shares the stable's shadow sink",
        "keda/overlays/cpu",
        lambda d: next(
            o for o in d if o["kind"] == "InferenceService" and o["metadata"]["name"] == "tts-canary"
        ),
        _set("/spec/predictor/containers/0/env/4/value", "s3://tts-shadow/stable"),
        "its own SHADOW_SINK",
    ),
    ("unknown kind", "knative/overlays/cpu", _kind("Broker"), _set("/kind", "Brokr"), "unknown kind"),
    (
        # KServe takes it for the storageUri of a custom container (found by `make e2e`).
        "storage URI under KServe's reserved env name",
        "keda/overlays/cpu",
        _isvc,
        _set("/spec/predictor/containers/0/env/0/name", "STORAGE_URI"),
        "env STORAGE_URI makes KServe inject its storage-initializer",
    ),
    (
        "playground on",
        "knative/overlays/gpu",
        _isvc,
        _set("/spec/predictor/containers/0/env/-", {"name": "PLAYGROUND", "value": "true"}),
        "PLAYGROUND serves a web page",
    ),
    (
        "undefined recorded series",
        "knative/overlays/cpu",
        _kind("PrometheusRule"),
        _set("/spec/groups/1/rules/0/expr", "tts:first_packet_seconds:p95_5m > 1.5"),
        "no recording rule defines",
    ),
]


@pytest.mark.parametrize(
    ("overlay", "select", "mutate", "expected"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_validator_names_each_broken_rule(rendered, overlay, select, mutate, expected):
    objects = copy.deepcopy(rendered[overlay])
    mutate(select(objects))

    problems = list(manifests.problems_of(objects))

    assert any(expected in p for p in problems), problems


def test_delivery_timeout_passes_where_the_catalog_is_stricter_than_the_api_server(rendered):
    # The catalog closes Trigger spec.delivery although the CRD preserves unknown fields there.
    trigger = copy.deepcopy(next(o for o in rendered["knative/overlays/cpu"] if o["kind"] == "Trigger"))

    problems = manifests.schema_problems(trigger)

    assert trigger["spec"]["delivery"]["timeout"] == "PT60S"
    assert problems == []


# --- against the running predictor ---------------------------------------------------------------


def _exported_families(predictor) -> set[str]:
    return {family.name for family in text_string_to_metric_families(predictor.get("/metrics").text)}


def test_every_metric_in_a_promql_expression_is_exported(rendered, predictor):
    exported = _exported_families(predictor)

    for overlay, objects in rendered.items():
        for name, expr in manifests.promql_expressions(Deployment(objects)).items():
            missing = manifests.metric_names(expr) - exported
            assert not missing, f"{overlay} {name} reads {missing}, which the predictor does not export"


def _local_port(predictor, container_port: int) -> int:
    # The manifests use KServe's ports; the test predictor runs on free ones.
    return {8080: predictor.http_port, 8081: int(predictor.grpc.rsplit(":", 1)[1])}[container_port]


def _probe_status(predictor, probe: dict) -> int:
    import httpx

    url = f"http://127.0.0.1:{_local_port(predictor, probe['port'])}{probe['path']}"
    return httpx.get(url, timeout=5).status_code


def _all_probes(rendered) -> list[tuple[str, str, dict]]:
    found = []
    for overlay, objects in rendered.items():
        for isvc in Deployment(objects).kind("InferenceService"):
            for kind, probe in probes(predictor_container(isvc)).items():
                found.append((f"{overlay} {isvc['metadata']['name']}", kind, probe))
    return found


def test_only_the_knative_stable_predictor_goes_without_a_startup_probe(rendered):
    # With a startup probe Knative's activator waits for the kubelet's Ready before it sends a woken
    # pod anything; without, it routes at its own probe (knative/base/kustomization.yaml).
    for overlay, objects in rendered.items():
        for isvc in Deployment(objects).kind("InferenceService"):
            kinds = probes(predictor_container(isvc))
            mode = isvc["metadata"].get("annotations", {}).get("serving.kserve.io/deploymentMode")
            where = f"{overlay} {isvc['metadata']['name']}"
            assert ("startupProbe" not in kinds) == (mode == "Serverless"), where
            assert {"readinessProbe", "livenessProbe"} <= kinds.keys(), where


def test_probes_answer_as_each_probe_expects_during_and_after_cold_start(rendered, start_predictor):
    # A long warm-up text stretches the window between "serving HTTP" and "warm".
    predictor = start_predictor(wait=False, WARMUP_TEXT=LONG_TEXT)
    predictor.wait_live()
    found = _all_probes(rendered)

    cold = {(where, kind): _probe_status(predictor, probe) for where, kind, probe in found}
    assert "model ready" not in predictor.logs(), "warm-up finished before the checks; lengthen LONG_TEXT"
    predictor.wait_ready()
    warm = {(where, kind): _probe_status(predictor, probe) for where, kind, probe in found}

    # Startup and readiness hold traffic back until warm; liveness must not restart a cold pod.
    for (where, kind), status in cold.items():
        assert status == (200 if kind == "livenessProbe" else 503), (
            f"{where} {kind} answered {status} while cold"
        )
    assert set(warm.values()) == {200}, warm


def test_trigger_delivers_an_event_the_predictor_accepts_and_the_reply_does_not_match_it(rendered, predictor):
    import httpx

    for overlay, objects in rendered.items():
        deployment = Deployment(objects)
        trigger_types = {t["spec"]["filter"]["attributes"]["type"] for t in deployment.kind("Trigger")}
        for trigger in deployment.kind("Trigger"):
            event_type = trigger["spec"]["filter"]["attributes"]["type"]
            headers = {
                "ce-specversion": "1.0",
                "ce-id": f"manifest-check-{overlay}",
                "ce-source": "/tests/manifests",
                "ce-type": event_type,
                "content-type": "application/json",
            }

            reply = httpx.post(
                predictor.url + trigger["spec"]["subscriber"]["uri"],
                headers=headers,
                content=json.dumps({"text": "Delivered by the broker."}),
                timeout=60,
            )

            assert reply.status_code == 200, f"{overlay}: {reply.text}"
            assert reply.headers["ce-type"] != event_type
            assert reply.headers["ce-type"] not in trigger_types, f"{overlay}: the reply would loop back"
