"""Validate the deployment manifests offline, and the CLI of `make manifests` / `make validate`.

There is no cluster here, so every claim about knative/ and keda/ (with the shared deploy/) is proven
three ways:

* Rendering: tts_ops.kustomize (`kubectl kustomize` when kubectl is on PATH, else its own
  renderer for the part of kustomize these manifests use). tests/system/test_manifests.py checks that the
  two agree wherever kubectl exists.
* Schemas: CRD kinds against cluster/schemas (generated from the pinned CRDs by `make schemas`) made strict (closed root, ObjectMeta checked, nodes
  marked x-kubernetes-preserve-unknown-fields reopened); core kinds with kubernetes-validate in strict
  mode; an unknown kind is an error.
* Lints and cross-checks for what no schema expresses: annotation keys and values, KEDA trigger
  metadata, the two scale-from-zero traps, probes, MODEL_DIR, event types, drain vs grace period,
  Kafka partitions vs replicas.

Usage: python -m tts_ops.manifests render [--out DIR] | validate
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import referencing
import yaml
from pydantic import TypeAdapter, ValidationError

# The only predictor modules this tool uses (old paths until the issue-10 restructure lands).
from predictor.config import Settings
from tts_ops.kustomize import Obj, render

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = ("knative/overlays/cpu", "knative/overlays/gpu", "keda/overlays/cpu", "keda/overlays/gpu")
# Generated from the CRDs pinned in cluster/versions.toml (`make schemas`); committed, so a fresh clone
# validates without anything beside it.
REPO_SCHEMAS = ROOT / "cluster" / "schemas"
# Core kinds are checked against this Kubernetes minor (kubernetes-validate's bundled schemas): the
# minor `make cluster` builds (cluster/versions.toml).
KUBERNETES_VERSION = "1.34.0"


def schema_dir() -> Path:
    """The repo's generated schemas; SCHEMA_DIR overrides (kinds it lacks fall back to the repo's)."""
    return Path(os.environ.get("SCHEMA_DIR", REPO_SCHEMAS))


# --- rendering ------------------------------------------------------------------------------------


def render_all() -> dict[str, list[Obj]]:
    return {overlay: render(ROOT / overlay) for overlay in OVERLAYS}


# --- schemas --------------------------------------------------------------------------------------


def describe(obj: Obj) -> str:
    return f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"


def _group_version(obj: Obj) -> tuple[str, str]:
    group, _, version = obj["apiVersion"].rpartition("/")
    return group, version


def is_core(obj: Obj) -> bool:
    group, _ = _group_version(obj)
    return group == "" or "." not in group or group.endswith(".k8s.io")


def schema_problems(obj: Obj) -> list[str]:
    if not isinstance(obj.get("metadata"), dict) or not obj["metadata"].get("name"):
        return ["metadata.name is missing"]
    if is_core(obj):
        return _core_problems(obj)
    schema = crd_schema(*_group_version(obj), obj["kind"])
    if schema is None:
        return [f"unknown kind {obj['apiVersion']} {obj['kind']}: no schema to validate it against"]
    validator = jsonschema.Draft202012Validator(schema, registry=_kubernetes_registry())
    return [f"{_pointer(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


def _core_problems(obj: Obj) -> list[str]:
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"unknown kind {obj['apiVersion']} {obj['kind']}: kubernetes-validate has no schema"]
    except kubernetes_validate.ValidationError as exc:
        return [f"{_pointer(exc.path)}: {exc.message}"]
    return []


def _pointer(path: Iterable[Any]) -> str:
    return "/" + "/".join(str(p) for p in path)


@cache
def crd_schema(group: str, version: str, kind: str) -> Obj | None:
    name = f"{group}/{kind.lower()}_{version}.json"
    for directory in dict.fromkeys((schema_dir(), REPO_SCHEMAS)):
        file = directory / name
        if file.is_file():
            return strict_schema(json.loads(file.read_text()))
    return None


def strict_schema(schema: Obj) -> Obj:
    """Make a catalog schema as strict as the API server where the catalog is open, and no stricter."""
    schema = copy.deepcopy(schema)
    _reopen_preserved(schema)
    properties = schema.setdefault("properties", {})
    # The root is open in the catalog: a typo like `specs:` would pass.
    schema["additionalProperties"] = False
    properties["metadata"] = _object_meta()
    for name in ("apiVersion", "kind"):
        properties.setdefault(name, {"type": "string"})
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
    return schema


def _reopen_preserved(node: Any) -> None:
    # The catalog's converter closed nodes that the API server keeps open (e.g. Trigger
    # spec.delivery, where `timeout` is valid).
    if isinstance(node, dict):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            node.pop("additionalProperties", None)
        for value in node.values():
            _reopen_preserved(value)
    elif isinstance(node, list):
        for value in node:
            _reopen_preserved(value)


def _kubernetes_schema_dir() -> Path:
    major_minor = ".".join(KUBERNETES_VERSION.split(".")[:2])
    return (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{major_minor}.0-local-strict"
    )


@cache
def _object_meta() -> Obj:
    return json.loads((_kubernetes_schema_dir() / "objectmeta-meta-v1.json").read_text())


@cache
def _kubernetes_registry() -> referencing.Registry:
    definitions = json.loads((_kubernetes_schema_dir() / "_definitions.json").read_text())
    return referencing.Resource.from_contents(definitions) @ referencing.Registry()


# --- lints: what the schemas leave open -----------------------------------------------------------

_DURATION = r"[0-9]+(ms|s|m|h)"
_NUMBER = r"[0-9]+(\.[0-9]+)?"
# Annotation keys in the domains our manifests use, with the values each accepts; any other key in
# these domains is a typo the API server would store and every controller would ignore.
ANNOTATIONS: dict[str, str] = {
    "serving.kserve.io/deploymentMode": "Serverless|Standard|RawDeployment",
    "serving.kserve.io/autoscalerClass": "hpa|keda|external|none",
    "autoscaling.knative.dev/class": "kpa.autoscaling.knative.dev|hpa.autoscaling.knative.dev",
    "autoscaling.knative.dev/metric": "concurrency|rps|cpu|memory",
    "autoscaling.knative.dev/target": _NUMBER,
    "autoscaling.knative.dev/target-utilization-percentage": _NUMBER,
    "autoscaling.knative.dev/initial-scale": "[0-9]+",
    "autoscaling.knative.dev/min-scale": "[0-9]+",
    "autoscaling.knative.dev/max-scale": "[0-9]+",
    "autoscaling.knative.dev/scale-down-delay": _DURATION,
    "autoscaling.knative.dev/scale-to-zero-pod-retention-period": _DURATION,
    "autoscaling.knative.dev/window": _DURATION,
    "eventing.knative.dev/broker.class": "MTChannelBasedBroker|Kafka",
    "httpscaledobject.keda.sh/skip-scaledobject-creation": "true|false",
}

# Every annotation and label key each project defines in the domains it owns, read from its source.
# A key in one of these domains that is not listed is a typo the API server stores and every
# controller ignores (`autoscaling.keda.sh/pause` pauses nothing). Keys are matched exactly.
KNOWN_KEYS: dict[str, frozenset[str]] = {
    # kedacore/keda apis/keda/v1alpha1/scaledobject_types.go (the ScaledObject constants);
    # kedacore/http-add-on operator/controllers/http/ (SkipScaledObjectCreationAnnotation) and its
    # docs/ref HTTPScaledObject reference (orphan-scaledobject).
    "keda.sh": frozenset(
        {
            "scaledobject.keda.sh/name",
            "scaledobject.keda.sh/transfer-hpa-ownership",
            "scaledobject.keda.sh/hpa-excluded-labels",
            "validations.keda.sh/hpa-ownership",
            "autoscaling.keda.sh/paused-replicas",
            "autoscaling.keda.sh/paused",
            "autoscaling.keda.sh/paused-scale-down",
            "httpscaledobject.keda.sh/skip-scaledobject-creation",
            "httpscaledobject.keda.sh/orphan-scaledobject",
        }
    ),
    # knative/serving pkg/apis/autoscaling/register.go (kebab-case keys, and the camelCase ones the
    # same file still accepts as aliases); pkg/apis/serving/register.go; knative/eventing
    # pkg/apis/eventing/register.go; networking.knative.dev/visibility as kserve's constants.go uses it.
    "knative.dev": frozenset(
        {
            *(
                "autoscaling.knative.dev/" + k
                for k in (
                    "class",
                    "metric",
                    "target",
                    "min-scale",
                    "max-scale",
                    "initial-scale",
                    "activation-scale",
                    "scale-down-delay",
                    "scale-to-zero-pod-retention-period",
                    "window",
                    "target-utilization-percentage",
                    "target-burst-capacity",
                    "panic-window-percentage",
                    "panic-threshold-percentage",
                    "metric-aggregation-algorithm",
                    "minScale",
                    "maxScale",
                    "initialScale",
                    "scaleToZeroPodRetentionPeriod",
                    "targetUtilizationPercentage",
                    "targetBurstCapacity",
                    "panicWindowPercentage",
                    "panicThresholdPercentage",
                    "kpa",
                )
            ),
            *(
                "serving.knative.dev/" + k
                for k in (
                    "rollout-duration",
                    "creator",
                    "lastModifier",
                    "routingState",
                    "routingStateModified",
                    "service",
                    "configuration",
                    "revision",
                    "route",
                    "visibility",
                    "progress-deadline",
                )
            ),
            "networking.knative.dev/visibility",
            "networking.knative.dev/disable-auto-tls",
            # knative/pkg apis/duck/register.go: the label that aggregates a ClusterRole into
            # Eventing's addressable-resolver (and source-observer).
            "duck.knative.dev/addressable",
            "duck.knative.dev/source",
            "features.knative.dev/queueproxy-resource-defaults",
            "eventing.knative.dev/broker.class",
            "eventing.knative.dev/scope",
            "eventing.knative.dev/injection",
            "eventing.knative.dev/release",
        }
    ),
    # kserve/kserve pkg/constants/constants.go (InferenceService annotations and labels).
    "serving.kserve.io": frozenset(
        "serving.kserve.io/" + k
        for k in (
            "deploymentMode",
            "autoscalerClass",
            "metrics",
            "targetUtilizationPercentage",
            "enable-tag-routing",
            "disable-localmodel",
            "enable-metric-aggregation",
            "enable-prometheus-scraping",
            "gke-accelerator",
            "nodegroup",
            "gpu-resource-types",
            "storage-initializer-uid",
            "inferenceservice",
            "inferencegraph",
            "trainedmodel-allocated",
            "kind",
        )
    ),
    # istio/api annotation/annotations.yaml (the sidecar.istio.io/ entries).
    "sidecar.istio.io": frozenset(
        "sidecar.istio.io/" + k
        for k in (
            "inject",
            "status",
            "interceptionMode",
            "proxyCPU",
            "proxyCPULimit",
            "proxyMemory",
            "proxyMemoryLimit",
            "proxyImage",
            "proxyImageType",
            "logLevel",
            "componentLogLevel",
            "agentLogLevel",
            "bootstrapOverride",
            "discoveryAddress",
            "extraStatTags",
            "rewriteAppHTTPProbers",
            "statsInclusionPrefixes",
            "statsInclusionRegexps",
            "statsInclusionSuffixes",
            "statsHistogramBuckets",
            "userVolume",
            "userVolumeMount",
            "enableCoreDump",
            "statusPort",
            "nativeSidecar",
        )
    ),
}


def key_domain(key: str) -> str | None:
    """Which of KNOWN_KEYS' domains a key falls in: `*.keda.sh/`, `*.knative.dev/`, or an exact one."""
    prefix = key.split("/", 1)[0] if "/" in key else ""
    for domain in KNOWN_KEYS:
        if prefix == domain or prefix.endswith("." + domain):
            return domain
    return None


def _metadata_blocks(node: Any) -> Iterator[Obj]:
    """Every ObjectMeta in an object: its own and its templates' (pod templates, ISVC predictor)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "metadata" and isinstance(value, dict):
                yield value
            yield from _metadata_blocks(value)
    elif isinstance(node, list):
        for item in node:
            yield from _metadata_blocks(item)


def unknown_keys(obj: Obj) -> list[str]:
    problems = []
    for meta in _metadata_blocks(obj):
        for field_name in ("annotations", "labels"):
            for key in meta.get(field_name) or {}:
                domain = key_domain(key)
                if domain is not None and key not in KNOWN_KEYS[domain] and key not in ANNOTATIONS:
                    problems.append(f"{field_name[:-1]} {key} is not a key {domain} defines (typo?)")
    return problems


# Trigger's CRD leaves spec open below the root (x-kubernetes-preserve-unknown-fields), so
# `spec.filtr` would be stored and ignored. Fields of TriggerSpec, its filter and DeliverySpec:
# knative/eventing pkg/apis/eventing/v1/trigger_types.go and pkg/apis/duck/v1/delivery_types.go.
TRIGGER_FIELDS: dict[str, frozenset[str]] = {
    "spec": frozenset({"broker", "brokerRef", "filter", "filters", "subscriber", "delivery"}),
    "filter": frozenset({"attributes"}),
    "delivery": frozenset(
        {"deadLetterSink", "retry", "backoffPolicy", "backoffDelay", "timeout", "retryAfterMax", "format"}
    ),
    "subscriber": frozenset({"ref", "uri", "CACerts", "audience"}),
}


def _trigger_problems(obj: Obj) -> list[str]:
    spec = obj.get("spec") or {}
    problems = [
        f"Trigger spec.{k} is not a TriggerSpec field" for k in sorted(set(spec) - TRIGGER_FIELDS["spec"])
    ]
    for part in ("filter", "delivery", "subscriber"):
        value = spec.get(part)
        if isinstance(value, dict):
            problems += [
                f"Trigger spec.{part}.{k} is not a field of {part}"
                for k in sorted(set(value) - TRIGGER_FIELDS[part])
            ]
    return problems


# KEDA's trigger metadata is map[string]string in the CRD: a misspelt key passes the schema and is
# ignored by KEDA. These are the keys each scaler reads (KEDA 2.17 docs; HTTP add-on 0.14 for
# external-push's httpScaledObject).
TRIGGER_METADATA: dict[str, set[str]] = {
    "prometheus": {
        "serverAddress",
        "query",
        "threshold",
        "activationThreshold",
        "namespace",
        "customHeaders",
        "ignoreNullValues",
        "unsafeSsl",
        "queryParameters",
        "authModes",
        "timeout",
    },
    "kafka": {
        "bootstrapServers",
        "consumerGroup",
        "topic",
        "lagThreshold",
        "activationLagThreshold",
        "offsetResetPolicy",
        "allowIdleConsumers",
        "scaleToZeroOnInvalidOffset",
        "excludePersistentLag",
        "limitToPartitionsWithLag",
        "partitionLimitation",
        "version",
        "sasl",
        "tls",
    },
    "external-push": {"scalerAddress", "tlsCertFile", "caCert", "httpScaledObject"},
}
TRIGGER_REQUIRED: dict[str, set[str]] = {
    "prometheus": {"serverAddress", "query", "threshold"},
    "kafka": {"bootstrapServers", "consumerGroup", "topic"},
    "external-push": {"scalerAddress"},
}
# Triggers whose signal exists while the target has no pods: only these can scale it from zero.
WAKES_FROM_ZERO = {"external-push", "kafka"}


def lint_problems(obj: Obj) -> list[str]:
    problems = []
    for key, value in (obj.get("metadata", {}).get("annotations") or {}).items():
        if key in ANNOTATIONS and not re.fullmatch(ANNOTATIONS[key], str(value)):
            problems.append(f"annotation {key}: {value!r} is not one of {ANNOTATIONS[key]}")
    problems += unknown_keys(obj)
    if obj["kind"] == "Trigger":
        problems += _trigger_problems(obj)
    if obj["kind"] == "InferenceService":
        for container in obj["spec"]["predictor"].get("containers", []):
            if any(e.get("name") == "STORAGE_URI" for e in container.get("env", [])):
                # KServe's CustomPredictor.GetStorageUri: the env var is a storageUri in disguise.
                problems.append(
                    f"container {container.get('name')}: env STORAGE_URI makes KServe inject its "
                    "storage-initializer over MODEL_DIR (the predictor reads VOICE_URI)"
                )
    if obj["kind"] == "InferenceService" and not is_serverless(obj):
        # Knative-only knobs are silently ignored in Standard mode: the value someone tuned does nothing.
        knative_only = [
            k for k in obj["metadata"].get("annotations", {}) if k.startswith("autoscaling.knative.dev/")
        ]
        knative_only += [k for k in ("containerConcurrency", "timeout") if k in obj["spec"]["predictor"]]
        problems += [f"{k} has no effect outside Serverless mode" for k in knative_only]
    if obj["kind"] == "ScaledObject":
        for trigger in obj["spec"].get("triggers", []):
            kind = trigger["type"]
            if kind not in TRIGGER_METADATA:
                problems.append(f"trigger type {kind!r} is not one this project lints")
                continue
            keys = set(trigger.get("metadata", {}))
            for key in sorted(keys - TRIGGER_METADATA[kind]):
                problems.append(f"{kind} trigger: unknown metadata key {key!r}")
            for key in sorted(TRIGGER_REQUIRED[kind] - keys):
                problems.append(f"{kind} trigger: missing metadata key {key!r}")
    if obj["kind"] == "VirtualService":
        for route in obj["spec"].get("http", []):
            if "mirror" in route and "mirrors" in route:
                problems.append("http route sets both mirror and mirrors (istiod rejects it)")
            percent = route.get("mirrorPercentage", {}).get("value")
            if percent is not None and not 0 <= percent <= 100:
                problems.append(f"mirrorPercentage {percent} is outside 0-100")
    return problems


# --- cross-checks between objects, and with the predictor's settings ----------------------------


@dataclass
class Deployment:
    """One rendered flavour, indexed for the cross-checks."""

    objects: list[Obj]
    by_kind: dict[str, list[Obj]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for obj in self.objects:
            self.by_kind.setdefault(obj["kind"], []).append(obj)

    def kind(self, kind: str) -> list[Obj]:
        return self.by_kind.get(kind, [])

    def named(self, kind: str, name: str) -> Obj | None:
        return next((o for o in self.kind(kind) if o["metadata"]["name"] == name), None)

    def inference_service_behind(self, service: str) -> Obj | None:
        """The InferenceService whose predictor KServe names `service` (Deployment and Service `<isvc>-predictor`)."""
        return next(
            (i for i in self.kind("InferenceService") if f"{i['metadata']['name']}-predictor" == service),
            None,
        )


def predictor_container(isvc: Obj) -> Obj:
    return next(c for c in isvc["spec"]["predictor"]["containers"] if c["name"] == "kserve-container")


def container_env(container: Obj) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def probes(container: Obj) -> dict[str, Obj]:
    kinds = ("startupProbe", "readinessProbe", "livenessProbe")
    return {kind: container[kind]["httpGet"] for kind in kinds if kind in container}


def promql_expressions(deployment: Deployment) -> dict[str, str]:
    """Every PromQL expression the manifests run: alert and recording rules, KEDA queries."""
    found = {}
    for rule_object in deployment.kind("PrometheusRule"):
        for group in rule_object["spec"]["groups"]:
            for rule in group["rules"]:
                found[rule.get("record") or rule["alert"]] = str(rule["expr"])
    for scaled in deployment.kind("ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            if trigger["type"] == "prometheus":
                found[f"{scaled['metadata']['name']}/{trigger.get('name', 'prometheus')}"] = trigger[
                    "metadata"
                ]["query"]
    return found


def metric_names(expr: str) -> set[str]:
    """Exported metric families an expression reads (tts_*, without the histogram/counter suffixes)."""
    names = set(re.findall(r"\btts_[a-z0-9_]+", expr))
    return {re.sub(r"_(bucket|sum|count|total|created)$", "", name) for name in names}


def recorded_names(expr: str) -> set[str]:
    return set(re.findall(r"\btts:[a-z0-9_:]+", expr))


def is_serverless(isvc: Obj) -> bool:
    return (
        isvc["metadata"].get("annotations", {}).get("serving.kserve.io/deploymentMode", "Serverless")
        == "Serverless"
    )


def _settings_defaults() -> dict[str, Any]:
    return {name: info.default for name, info in Settings.model_fields.items()}


def _settings_problems(env: dict[str, str]) -> list[str]:
    known = {name.upper() for name in Settings.model_fields}
    ours = {k.lower(): v for k, v in env.items() if k in known}
    problems = [
        f"env {k} is not a predictor setting"
        for k in env
        if k not in known and k != "HOME" and not k.startswith("AWS_")
    ]
    try:
        Settings(**ours)
    except ValidationError as exc:
        problems += [f"env {'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()]
    return problems


def _playground_on(env: dict[str, str]) -> bool:
    """PLAYGROUND as the predictor reads it (an invalid value is _settings_problems' to report)."""
    try:
        return TypeAdapter(bool).validate_python(env.get("PLAYGROUND", "false"))
    except ValidationError:
        return False


def consistency_problems(deployment: Deployment) -> list[str]:
    problems: list[str] = []
    defaults = _settings_defaults()
    isvcs = deployment.kind("InferenceService")
    if not isvcs:
        return ["no InferenceService"]
    for isvc in isvcs:
        where = describe(isvc)
        predictor = isvc["spec"]["predictor"]
        if "storageUri" in json.dumps(isvc) or "storageUris" in predictor:
            problems.append(
                f"{where}: storageUri makes KServe inject its storage-initializer (a second download)"
            )
        container = predictor_container(isvc)
        env = container_env(container)
        problems += [f"{where}: {p}" for p in _settings_problems(env)]
        if _playground_on(env):
            problems.append(f"{where}: PLAYGROUND serves a web page on the inference port; keep it off")
        model_dir = env.get("MODEL_DIR", str(defaults["model_dir"]))
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in predictor.get("volumes", [])}
        volume = volumes.get(mounts.get(model_dir, ""), {})
        if "emptyDir" not in volume:
            problems.append(f"{where}: MODEL_DIR {model_dir} is not the mountPath of an emptyDir")
        elif "sizeLimit" not in volume["emptyDir"]:
            problems.append(f"{where}: the model emptyDir has no sizeLimit")
        ports = {p["containerPort"] for p in container.get("ports", [])}
        for kind, probe in probes(container).items():
            if probe.get("port") not in ports:
                problems.append(f"{where}: {kind} port {probe.get('port')} is not a container port")
        if container.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/v2/health/live":
            problems.append(f"{where}: readiness on the liveness path sends traffic to cold pods")
        drain = float(env.get("DRAIN_TIMEOUT_S", defaults["drain_timeout_s"]))
        # Knative sets the pod's grace period to the revision timeout.
        grace = (
            predictor.get("timeout")
            if is_serverless(isvc)
            else predictor.get("terminationGracePeriodSeconds", 30)
        )
        if grace is None or drain >= grace:
            problems.append(f"{where}: DRAIN_TIMEOUT_S {drain} is not below the grace period {grace}")
        security = container.get("securityContext", {})
        wanted = {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}
        for key, value in wanted.items():
            if security.get(key) is not value:
                problems.append(f"{where}: securityContext.{key} should be {value}")
        if "ALL" not in security.get("capabilities", {}).get("drop", []):
            problems.append(f"{where}: securityContext does not drop ALL capabilities")
    problems += _eventing_problems(deployment, defaults)
    problems += _mirror_problems(deployment)
    problems += _keda_problems(deployment)
    problems += _promql_problems(deployment)
    return problems


def _eventing_problems(deployment: Deployment, defaults: dict[str, Any]) -> list[str]:
    problems = []
    for trigger in deployment.kind("Trigger"):
        where = describe(trigger)
        accepted = defaults["ce_request_type"]
        wanted = trigger["spec"].get("filter", {}).get("attributes", {}).get("type")
        if wanted != accepted:
            problems.append(f"{where}: filters on type {wanted!r}, the predictor accepts {accepted!r}")
        if wanted == defaults["ce_reply_type"]:
            problems.append(f"{where}: filters on the reply type: replies would loop back forever")
        if not deployment.named("Broker", trigger["spec"]["broker"]):
            problems.append(f"{where}: broker {trigger['spec']['broker']!r} is not deployed")
        subscriber = trigger["spec"]["subscriber"]
        ref = subscriber.get("ref", {})
        if ref and not deployment.named(ref["kind"], ref["name"]):
            problems.append(f"{where}: subscriber {ref['kind']} {ref['name']} is not deployed")
        if not re.fullmatch(r"/v1/models/[a-z0-9-]+:predict", subscriber.get("uri", "")):
            problems.append(f"{where}: subscriber uri {subscriber.get('uri')!r} is not the v1 predict path")
        sink = trigger["spec"].get("delivery", {}).get("deadLetterSink", {}).get("ref")
        if not sink:
            problems.append(f"{where}: no deadLetterSink: events that exhaust their retries are lost")
        elif not deployment.named(sink["kind"], sink["name"]):
            problems.append(f"{where}: deadLetterSink {sink['kind']} {sink['name']} is not deployed")
    return problems


def can_scale_to_zero(deployment: Deployment, service_host: str) -> tuple[bool, str]:
    """Whether the InferenceService behind `<isvc>-predictor[.ns.svc...]` may have zero pods."""
    service = service_host.split(".")[0]
    isvc = deployment.inference_service_behind(service)
    if isvc is None:
        return True, f"no InferenceService serves {service_host}"
    if isvc["spec"]["predictor"].get("minReplicas", 1) == 0:
        return True, f"{describe(isvc)} has minReplicas 0"
    for scaled in deployment.kind("ScaledObject"):
        if (
            scaled["spec"]["scaleTargetRef"]["name"] == service
            and scaled["spec"].get("minReplicaCount", 0) == 0
        ):
            return True, f"{describe(scaled)} scales it to zero"
    return False, ""


def _mirror_problems(deployment: Deployment) -> list[str]:
    problems = []
    if deployment.kind("VirtualService"):
        # compare joins two record sets; revisions sharing one sink could not be told apart.
        sinks = {
            i["metadata"]["name"]: container_env(predictor_container(i)).get("SHADOW_SINK", "")
            for i in deployment.kind("InferenceService")
        }
        if "" in sinks.values() or len(set(sinks.values())) < len(sinks):
            problems.append(f"shadow records: every InferenceService needs its own SHADOW_SINK ({sinks})")
    for vs in deployment.kind("VirtualService"):
        for route in vs["spec"].get("http", []):
            for mirror in [route.get("mirror")] + [m.get("destination") for m in route.get("mirrors", [])]:
                if not mirror:
                    continue
                zero, why = can_scale_to_zero(deployment, mirror["host"])
                if zero:
                    problems.append(
                        f"{describe(vs)}: mirror target {mirror['host']} can scale to zero ({why}); "
                        "a mirrored request never wakes it"
                    )
    return problems


def _keda_admission_problems(scaled: Obj) -> list[str]:
    """What KEDA v2.18 refuses and no schema says (found by tests/e2e against the real KEDA)."""
    spec, where = scaled["spec"], describe(scaled)
    problems = []
    # The admission webhook refuses a trigger name used twice (ValidateTriggers).
    names = [t["name"] for t in spec.get("triggers", []) if t.get("name")]
    problems += [
        f"{where}: trigger name {n!r} is used twice" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    # The webhook only logs inverted replica bounds; the operator checks them again when it reconciles
    # (CheckReplicaCountBoundsAreValid, where a set minReplicaCount counts as at least 1).
    least = max(spec["minReplicaCount"], 1) if "minReplicaCount" in spec else 0
    most = spec.get("maxReplicaCount", 100)
    if least > most:
        problems.append(f"{where}: minReplicaCount {spec['minReplicaCount']} is above maxReplicaCount {most}")
    elif "idleReplicaCount" in spec and spec["idleReplicaCount"] >= least:
        problems.append(
            f"{where}: idleReplicaCount {spec['idleReplicaCount']} must be below minReplicaCount {least}"
        )
    return problems


def _keda_problems(deployment: Deployment) -> list[str]:
    problems = []
    for scaled in deployment.kind("ScaledObject"):
        where = describe(scaled)
        target = scaled["spec"]["scaleTargetRef"]["name"]
        isvc = deployment.inference_service_behind(target)
        if isvc is None:
            problems.append(f"{where}: scales {target}, which no InferenceService creates")
        elif isvc["metadata"].get("annotations", {}).get("serving.kserve.io/autoscalerClass") != "external":
            problems.append(
                f"{where}: {describe(isvc)} is not autoscalerClass external; KServe's HPA would fight KEDA"
            )
        problems += _keda_admission_problems(scaled)
        types = {t["type"] for t in scaled["spec"]["triggers"]}
        if scaled["spec"].get("minReplicaCount", 0) == 0 and not types & WAKES_FROM_ZERO:
            problems.append(
                f"{where}: minReplicaCount 0 but no trigger whose signal exists at zero pods "
                f"({', '.join(sorted(WAKES_FROM_ZERO))}); it would never scale up again"
            )
        for trigger in scaled["spec"]["triggers"]:
            meta = trigger.get("metadata", {})
            if trigger["type"] == "external-push" and "httpScaledObject" in meta:
                http = deployment.named("HTTPScaledObject", meta["httpScaledObject"])
                if http is None:
                    problems.append(f"{where}: httpScaledObject {meta['httpScaledObject']!r} is not deployed")
                elif (
                    http["metadata"]
                    .get("annotations", {})
                    .get("httpscaledobject.keda.sh/skip-scaledobject-creation")
                    != "true"
                ):
                    problems.append(
                        f"{where}: {describe(http)} would create a second ScaledObject for {target}"
                    )
                elif http["spec"]["scaleTargetRef"]["name"] != target:
                    problems.append(f"{where}: {describe(http)} routes to another Deployment")
            if trigger["type"] == "kafka":
                problems += _kafka_problems(deployment, where, meta, scaled["spec"])
    return problems


def _kafka_problems(deployment: Deployment, where: str, meta: dict[str, str], spec: Obj) -> list[str]:
    # Knative's Kafka Broker names its topic and each Trigger's consumer group from these templates.
    problems = []
    brokers = {
        f"knative-broker-{b['metadata']['namespace']}-{b['metadata']['name']}": b
        for b in deployment.kind("Broker")
        if b["metadata"].get("annotations", {}).get("eventing.knative.dev/broker.class") == "Kafka"
    }
    broker = brokers.get(meta.get("topic", ""))
    if broker is None:
        return [f"{where}: kafka topic {meta.get('topic')!r} is no Kafka Broker's topic ({sorted(brokers)})"]
    groups = {
        f"knative-trigger-{t['metadata']['namespace']}-{t['metadata']['name']}"
        for t in deployment.kind("Trigger")
        if t["spec"]["broker"] == broker["metadata"]["name"]
    }
    if meta.get("consumerGroup") not in groups:
        problems.append(
            f"{where}: consumerGroup {meta.get('consumerGroup')!r} is no Trigger's group ({sorted(groups)})"
        )
    config_ref = broker.get("spec", {}).get("config", {})
    config = deployment.named(config_ref.get("kind", "ConfigMap"), config_ref.get("name", ""))
    if config is None:
        problems.append(f"{where}: Broker {broker['metadata']['name']} has no config ConfigMap")
    else:
        data = config["data"]
        if data.get("bootstrap.servers") != meta.get("bootstrapServers"):
            problems.append(f"{where}: bootstrapServers differs from the Broker's bootstrap.servers")
        # KEDA's kafka scaler never asks for more replicas than the topic has partitions (idle
        # consumers), so fewer partitions would silently lower the replica bound.
        partitions = data.get("default.topic.partitions")
        most = spec.get("maxReplicaCount", 100)  # KEDA's default
        if partitions is None:
            problems.append(f"{where}: the Broker's config sets no default.topic.partitions")
        elif int(partitions) < most:
            problems.append(
                f"{where}: the topic's {partitions} partitions cap the kafka trigger below "
                f"maxReplicaCount {most}"
            )
    return problems


def _promql_problems(deployment: Deployment) -> list[str]:
    recorded = {
        r["record"]
        for o in deployment.kind("PrometheusRule")
        for g in o["spec"]["groups"]
        for r in g["rules"]
        if "record" in r
    }
    problems = []
    for name, expr in promql_expressions(deployment).items():
        for used in sorted(recorded_names(expr) - recorded):
            problems.append(f"{name}: reads {used}, which no recording rule defines")
        if not metric_names(expr) and not recorded_names(expr):
            problems.append(f"{name}: reads no tts_* metric")
    return problems


# --- entry points ---------------------------------------------------------------------------------


def problems_of(objects: list[Obj]) -> Iterator[str]:
    for obj in objects:
        for problem in schema_problems(obj) + lint_problems(obj):
            yield f"{describe(obj)}: {problem}"
    yield from consistency_problems(Deployment(objects))


def write_rendered(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for overlay, objects in render_all().items():
        file = out / (overlay.replace("/overlays/", "-") + ".yaml")
        tmp = file.with_suffix(".yaml.tmp")
        tmp.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        tmp.replace(file)
        written.append(file)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tts_ops.manifests", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    render_cmd = sub.add_parser("render", help="render every overlay to DIR/<flavour>-<overlay>.yaml")
    render_cmd.add_argument("--out", type=Path, default=ROOT / ".cache" / "manifests")
    sub.add_parser("validate", help="render and validate every overlay; exit 1 on any problem")
    args = parser.parse_args(argv)
    if args.command == "render":
        for file in write_rendered(args.out):
            print(file.relative_to(ROOT) if file.is_relative_to(ROOT) else file)
        return 0
    if not schema_dir().is_dir():
        print(f"schema folder {schema_dir()} not found (set SCHEMA_DIR)", file=sys.stderr)
        return 2
    failed = 0
    for overlay, objects in render_all().items():
        problems = list(problems_of(objects))
        failed += bool(problems)
        status = "ok" if not problems else f"{len(problems)} problem(s)"
        print(f"{overlay}: {len(objects)} objects, {status}")
        for problem in problems:
            print(f"  {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
