"""The simulation's knobs, read from the rendered manifests; `--set key=value` overrides one.

Every key has a default and a source: the manifests (annotation, spec field, env var), else the
upstream default of the controller that reads it (Knative's config-autoscaler, kube-controller-
manager's HPA flags, KEDA's and its HTTP add-on's documented defaults), else a pod-start parameter
of our own, named below. `from_manifests` never invents a value the manifests state. `read` also
says which engine the simulated predictor runs (its ENGINE, DEVICE, DTYPE and COMPILE as the predictor
resolves them), so `simulate` can pick the profile measured on that engine.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tts_ops.simulate.errors import SimulateError

# A pod's start on `make cluster`, medians of the wakes from zero in docs/cluster.md.
SCHEDULE_S = 0.45
SANDBOX_S = 0.115
QUEUE_PROXY_S = 0.05
INTERCEPTOR_ROUTES_S = 0.10
ACTIVATOR_ROUTES_S = 0.13

# key: (default, unit and where it comes from)
KEYS: dict[str, tuple[Any, str]] = {
    # --- pods (both flavours) ---
    # Measured on `make cluster` (docs/cluster.md "A pod's start, step by step"): the kubelet's log at
    # -v=2 against the predictor's own over 14 keda and 26 knative wakes from zero (testing/wakes.py).
    "pod.schedule_s": (
        SCHEDULE_S,
        "s, scale-up -> the kubelet starts the pod's probe workers (ReplicaSet, scheduler, kubelet "
        "admission, volumes; the activator's poke of the autoscaler under Knative); measured",
    ),
    "pod.sandbox_s": (
        SANDBOX_S,
        "s, the probe workers start -> the container's process starts (sandbox, network, container): "
        "the startup probe's ticks lead the process by this in a pod of one container; measured",
    ),
    "pod.relist_s": (1.0, "s, the kubelet's PLEG relist period: it sees a container running at the next one"),
    "pod.image_pull_s": (0.0, "s, image pull; 0 = image already on the node (IfNotPresent, warm pool)"),
    "pod.readiness_period_s": (1.0, "s, readinessProbe.periodSeconds"),
    "pod.startup_period_s": (0.0, "s, startupProbe.periodSeconds (0 = no startup probe)"),
    "pod.max_queue": (32, "requests waiting per pod before 503 (MAX_QUEUE)"),
    "pod.request_timeout_s": (30.0, "s, REQUEST_TIMEOUT_S: still queued at the pod after this -> 503"),
    "pod.close_when_busy": (
        True,
        "CLOSE_WHEN_BUSY: a pod with requests waiting answers Connection: close, so the KEDA interceptor's "
        "keep-alive pool keeps connections only to pods that were not busy when they last answered",
    ),
    "pod.engine_workers": (
        1,
        "engine calls a pod runs at once: ENGINE_WORKERS, at most one per CPU (CPU_THREADS, else the "
        "container's limits.cpu rounded down), as Settings.workers(); a call beside another takes the "
        "profile's overlap_factor times its time alone",
    ),
    "pod.cpus": (
        1.0,
        "cores one pod may use (limits.cpu; 1 without a limit): a synthesis runs on its worker's part "
        "of them, a cold start on all of them, as the profile measured them",
    ),
    "node.cpus": (
        0.0,
        "cores the predictor pods share (0 = every pod has what its profile was measured with); the "
        "syntheses and cold starts under way share them, each at most at its pod's speed (node.py)",
    ),
    "node.cpus_over_time": (
        "",
        "T:CPUS,... : from T seconds after the trace starts the pods share CPUS cores (node.cpus before "
        "the first T); a replay's node gives them as the rest of the node's use changed (0 = unlimited)",
    ),
    "replicas.min": (0, "minReplicas / minReplicaCount"),
    "replicas.max": (4, "maxReplicas / maxReplicaCount"),
    "replicas.start": (0, "pods ready when the trace starts (0: scaled to zero)"),
    "random.seed": (
        0,
        "seed of the run's random choices (the ready pod kube-proxy picks for a new KEDA connection, the "
        "order held requests reach the first pod in): the same seed, the same run; another seed, another "
        "draw of the same traffic",
    ),
    # --- Knative KPA (knative/serving config-autoscaler defaults unless annotated) ---
    "kpa.metric": ("concurrency", "autoscaling.knative.dev/metric: concurrency | rps"),
    "kpa.target": (100.0, "autoscaling.knative.dev/target (requests in flight, or per second)"),
    "kpa.target_utilization": (0.7, "target-utilization-percentage / 100"),
    "kpa.container_concurrency": (0, "containerConcurrency, hard limit per pod (0 = unlimited)"),
    "kpa.stable_window_s": (60.0, "s, autoscaling.knative.dev/window"),
    "kpa.panic_window_pct": (10.0, "% of the stable window, panic-window-percentage"),
    "kpa.panic_threshold_pct": (200.0, "%, panic-threshold-percentage"),
    "kpa.max_scale_up_rate": (1000.0, "max-scale-up-rate"),
    "kpa.max_scale_down_rate": (2.0, "max-scale-down-rate"),
    "kpa.initial_scale": (1, "autoscaling.knative.dev/initial-scale (at revision creation only)"),
    "kpa.activation_scale": (1, "autoscaling.knative.dev/activation-scale"),
    "kpa.scale_down_delay_s": (0.0, "s, autoscaling.knative.dev/scale-down-delay"),
    "kpa.scale_to_zero_grace_s": (30.0, "s, scale-to-zero-grace-period"),
    "kpa.pod_retention_s": (0.0, "s, autoscaling.knative.dev/scale-to-zero-pod-retention-period"),
    "kpa.target_burst_capacity": (200.0, "autoscaling.knative.dev/target-burst-capacity"),
    "kpa.activator_routes_s": (
        ACTIVATOR_ROUTES_S,
        "s, pod Ready -> the activator sends it requests (the private Service's Endpoints, the "
        "activator's own probe of the pod, its throttler); Ready gates it because a startup probe "
        "turns the activator's earlier probing off (serving pkg/activator/net/revision_backends.go); "
        "measured",
    ),
    "kpa.activator_probe_s": (
        0.3,
        "s, the activator probes a revision's pods not yet healthy this often: its ticker is 0.2 s "
        "(revision_backends.go probeFrequency), but a round that fails also probes the clusterIP, and "
        "rounds came 0.30 s apart in its log; without a startup probe it sends a pod requests at the "
        "first round that passes",
    ),
    "kpa.queue_proxy_s": (
        QUEUE_PROXY_S,
        "s, added to pod.sandbox_s in a Knative pod, which starts queue-proxy beside ours (0.165 s "
        "against 0.115 s measured)",
    ),
    "kpa.revision_timeout_s": (
        300.0,
        "s, the predictor's `timeout` (Knative revision timeout): slower -> timed_out",
    ),
    # --- KEDA + HPA ---
    "keda.polling_interval_s": (30.0, "s, ScaledObject pollingInterval"),
    "keda.cooldown_s": (300.0, "s, ScaledObject cooldownPeriod"),
    "keda.initial_cooldown_s": (0.0, "s, ScaledObject initialCooldownPeriod (from t=0)"),
    "keda.prom.threshold": (0.0, "prometheus trigger threshold, AverageValue (0 = no such trigger)"),
    "keda.prom.activation": (0.0, "prometheus trigger activationThreshold"),
    "keda.scrape_s": (30.0, "s, PodMonitor podMetricsEndpoints[].interval (tts_queue_depth)"),
    "keda.http.target": (0.0, "HTTPScaledObject scalingMetric.concurrency.targetValue (0 = none)"),
    "keda.http.scaledown_period_s": (300.0, "s, HTTPScaledObject scaledownPeriod"),
    "keda.http.queue_tick_s": (
        0.5,
        "s, the add-on scaler's ping of the interceptors' request counts (KEDA_HTTP_QUEUE_TICK_DURATION)",
    ),
    "keda.http.stream_interval_s": (
        0.2,
        "s, the add-on scaler's push stream to KEDA (KEDA_HTTP_SCALER_STREAM_INTERVAL_MS): a request at "
        "zero wakes KEDA at the stream's next send after the next ping",
    ),
    "keda.http.endpoints_s": (
        INTERCEPTOR_ROUTES_S,
        "s, pod Ready -> the interceptor forwards to it (kubelet status, EndpointSlice, the "
        "interceptor's informer); measured",
    ),
    # kedacore/http-add-on interceptor/config/timeouts.go defaults; HTTPScaledObject spec.timeouts overrides.
    "keda.http.wait_timeout_s": (
        20.0,
        "s, timeouts.conditionWait (KEDA_CONDITION_WAIT_TIMEOUT): held longer -> 502",
    ),
    "keda.http.response_header_timeout_s": (
        0.5,
        "s, timeouts.responseHeader (KEDA_RESPONSE_HEADER_TIMEOUT): a reply slower than this -> 502",
    ),
    "keda.kafka.lag_threshold": (0.0, "kafka trigger lagThreshold (0 = no such trigger)"),
    "keda.kafka.activation": (0.0, "kafka trigger activationLagThreshold"),
    "keda.events_fraction": (0.0, "share of requests arriving as CloudEvents through Kafka, 0..1"),
    "hpa.sync_s": (15.0, "s, --horizontal-pod-autoscaler-sync-period"),
    "hpa.first_sync_s": (
        15.0,
        "s, the HPA's first sync after the trace starts: its phase is set by when kube-controller-manager "
        "started, so a replay of a measured run gives the phase that run had; default one period",
    ),
    "hpa.tolerance": (0.1, "--horizontal-pod-autoscaler-tolerance"),
    "hpa.scale_up.window_s": (0.0, "s, behavior.scaleUp.stabilizationWindowSeconds"),
    "hpa.scale_up.policies": ("Pods:4:15,Percent:100:15", "behavior.scaleUp.policies TYPE:VALUE:PERIOD,..."),
    "hpa.scale_up.select": ("Max", "behavior.scaleUp.selectPolicy"),
    "hpa.scale_down.window_s": (300.0, "s, behavior.scaleDown.stabilizationWindowSeconds"),
    "hpa.scale_down.policies": ("Percent:100:15", "behavior.scaleDown.policies"),
    "hpa.scale_down.select": ("Max", "behavior.scaleDown.selectPolicy"),
}

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$")


def duration_s(text: str, where: str) -> float:
    """Go duration strings as Knative annotations use them ("2m", "1m30s", "600s"), or plain seconds."""
    text = str(text).strip()
    try:
        return float(text)
    except ValueError:
        pass
    m = _DURATION.match(text)
    if not text or not m:
        raise SimulateError(f"{where}: {text!r} is not a duration")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + s


def render(directory: Path) -> list[dict]:
    """The manifests as kustomize renders them (kubectl when installed, else our own renderer)."""
    from tts_ops.kustomize import RenderError
    from tts_ops.kustomize import render as render_dir

    try:
        return render_dir(directory.resolve())
    except (RenderError, OSError) as exc:
        raise SimulateError(f"{directory}: cannot render: {exc}") from None


def defaults() -> dict[str, Any]:
    from predictor.config import Settings

    values = {k: v for k, (v, _) in KEYS.items()}
    values["pod.max_queue"] = Settings.model_fields["max_queue"].default
    values["pod.request_timeout_s"] = Settings.model_fields["request_timeout_s"].default
    values["pod.close_when_busy"] = Settings.model_fields["close_when_busy"].default
    return values


def _one(objects: list[dict], kind: str, pred: Callable[[dict], bool] = lambda o: True) -> dict | None:
    found = [o for o in objects if o.get("kind") == kind and pred(o)]
    return found[0] if found else None


def _named(objects: list[dict], kind: str, name: str | None) -> dict | None:
    return next((o for o in objects if o.get("kind") == kind and o["metadata"]["name"] == name), None)


@dataclass(frozen=True)
class Engine:
    """The engine the simulated predictor runs, as `predictor.config.Settings.engine_name` resolves it."""

    name: str  # onnx | torch
    device: str  # cpu | cuda (cuda:N counted as cuda)
    why: str  # the env that made it, e.g. "ENGINE=auto, DEVICE=cuda -> torch"


@dataclass(frozen=True)
class Overlay:
    flavour: str  # knative | keda
    values: dict[str, Any]
    engine: Engine


def from_manifests(directory: Path | str) -> tuple[str, dict[str, Any]]:
    """(flavour, values): 'knative' for a Serverless InferenceService on the KPA, 'keda' for a
    ScaledObject; anything else has no autoscaling object to simulate."""
    overlay = read(directory)
    return overlay.flavour, overlay.values


def read(directory: Path | str) -> Overlay:
    """from_manifests' flavour and values, and the engine of the predictor they scale."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SimulateError(f"--manifests {directory}: not a directory")
    objects = render(directory)
    values = defaults()
    scaled = _one(objects, "ScaledObject")
    isvc = _one(
        objects,
        "InferenceService",
        lambda o: (
            o["metadata"].get("annotations", {}).get("serving.kserve.io/deploymentMode") == "Serverless"
        ),
    )
    if scaled is not None:
        flavour = "keda"
        isvc = _one(
            objects,
            "InferenceService",
            lambda o: o["metadata"]["name"] in scaled["spec"]["scaleTargetRef"]["name"],
        )
        _read_keda(objects, scaled, values, directory)
    elif isvc is not None and "kpa" in isvc["metadata"].get("annotations", {}).get(
        "autoscaling.knative.dev/class", "kpa.autoscaling.knative.dev"
    ):
        flavour = "knative"
        _read_knative(isvc, values, directory)
    else:
        raise SimulateError(
            f"--manifests {directory}: no autoscaling object (a Serverless InferenceService on the KPA, "
            "or a KEDA ScaledObject) in the rendered manifests"
        )
    if isvc is None:
        raise SimulateError(f"--manifests {directory}: the ScaledObject scales no InferenceService")
    env = _read_predictor(isvc, values)
    monitor = _one(objects, "PodMonitor")
    if monitor is not None and flavour == "keda":
        for ep in monitor["spec"].get("podMetricsEndpoints", []):
            if "interval" in ep:
                values["keda.scrape_s"] = duration_s(ep["interval"], f"{directory}: PodMonitor interval")
    name = isvc["metadata"]["name"]
    return Overlay(
        flavour, values, predictor_engine(env, f"--manifests {directory}: InferenceService {name}")
    )


# The settings that choose the engine (Settings.engine_name reads these and nothing else).
ENGINE_ENV = ("ENGINE", "DEVICE", "DTYPE", "COMPILE")


def predictor_engine(env: dict[str, str], where: str = "env") -> Engine:
    """The engine a predictor with this container env runs: the env's ENGINE, DEVICE, DTYPE and
    COMPILE, the rest at Settings' defaults (never this process's environment), resolved as the
    predictor resolves ENGINE=auto."""
    given = {k: env[k] for k in ENGINE_ENV if k in env}
    resolved = _resolved(given, where)
    device = "cuda" if resolved.device.startswith("cuda") else "cpu"
    stated = ", ".join(f"{k}={v}" for k, v in given.items()) or "no ENGINE, DEVICE, DTYPE or COMPILE"
    if resolved.engine == "auto":
        stated += f", so ENGINE=auto resolves to {resolved.engine_name} on {device}"
    return Engine(resolved.engine_name, device, f"the predictor's env has {stated}")


def cpu_quantity(text: str) -> float:
    """A Kubernetes CPU quantity ("2", "1500m", "0.5") in CPUs."""
    text = str(text).strip()
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        raise SimulateError(f"limits.cpu: {text!r} is not a CPU quantity") from None


def engine_workers(env: dict[str, str], limits: dict[str, Any]) -> int:
    """Engine calls the predictor with this env runs at once in a container of these limits:
    Settings.workers() with CPU_THREADS, else the CPU quota rounded down (at least one, as
    config.container_cpus reads it; no limit: one, since the node's cores are unknown here)."""
    given: dict[str, str] = {k: env[k] for k in ("ENGINE_WORKERS", "CPU_THREADS") if k in env}
    if "CPU_THREADS" not in given or given["CPU_THREADS"] == "auto":
        given["CPU_THREADS"] = str(max(1, int(cpu_quantity(limits["cpu"])))) if "cpu" in limits else "1"
    return _resolved(given, "the predictor's env").workers()


def _resolved(env: dict[str, str], where: str) -> Any:
    """Settings from these env vars alone (as the predictor reads them); bad ones are SimulateError."""
    from pydantic import ValidationError

    try:
        return _manifest_settings()(**{k.lower(): v for k, v in env.items()})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        raise SimulateError(f"{where}: {problems}") from None


@functools.cache
def _manifest_settings() -> type:
    """Settings read from the arguments alone: a pod's env is its manifest's, not the shell's that
    runs the simulator."""
    from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

    from predictor.config import Settings

    class ManifestSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings,)

    return ManifestSettings


def _read_predictor(isvc: dict, values: dict[str, Any]) -> dict[str, str]:
    """The predictor container's knobs into values; its literal env (valueFrom and envFrom are not read)."""
    container = isvc["spec"]["predictor"]["containers"][0]
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    if "MAX_QUEUE" in env:
        values["pod.max_queue"] = int(env["MAX_QUEUE"])
    if "REQUEST_TIMEOUT_S" in env:
        values["pod.request_timeout_s"] = float(env["REQUEST_TIMEOUT_S"])
    if "CLOSE_WHEN_BUSY" in env:
        values["pod.close_when_busy"] = _resolved(
            {"CLOSE_WHEN_BUSY": env["CLOSE_WHEN_BUSY"]}, "the predictor's env"
        ).close_when_busy
    limits = container.get("resources", {}).get("limits", {})
    values["pod.engine_workers"] = engine_workers(env, limits)
    if "cpu" in limits:
        values["pod.cpus"] = cpu_quantity(limits["cpu"])
    probe = container.get("readinessProbe", {})
    if "periodSeconds" in probe:
        values["pod.readiness_period_s"] = float(probe["periodSeconds"])
    # A cold start ends at the startup probe's first pass: at 10 s a period added up to 10 s to every
    # start from zero on the local cluster (docs/cluster.md).
    startup = container.get("startupProbe")
    if startup is not None:
        values["pod.startup_period_s"] = float(startup.get("periodSeconds", 10))
    return env


def _read_knative(isvc: dict, values: dict[str, Any], where: Path) -> None:
    ann = isvc["metadata"].get("annotations", {})
    spec = isvc["spec"]["predictor"]
    numeric = {
        "autoscaling.knative.dev/target": "kpa.target",
        "autoscaling.knative.dev/initial-scale": "kpa.initial_scale",
        "autoscaling.knative.dev/activation-scale": "kpa.activation_scale",
        "autoscaling.knative.dev/target-burst-capacity": "kpa.target_burst_capacity",
        "autoscaling.knative.dev/panic-window-percentage": "kpa.panic_window_pct",
        "autoscaling.knative.dev/panic-threshold-percentage": "kpa.panic_threshold_pct",
        "autoscaling.knative.dev/target-utilization-percentage": "kpa.target_utilization",
    }
    for annotation, key in numeric.items():
        if annotation in ann:
            value = float(ann[annotation])
            values[key] = value / 100 if key == "kpa.target_utilization" else type(values[key])(value)
    durations = {
        "autoscaling.knative.dev/window": "kpa.stable_window_s",
        "autoscaling.knative.dev/scale-down-delay": "kpa.scale_down_delay_s",
        "autoscaling.knative.dev/scale-to-zero-pod-retention-period": "kpa.pod_retention_s",
    }
    for annotation, key in durations.items():
        if annotation in ann:
            values[key] = duration_s(ann[annotation], f"{where}: {annotation}")
    if "autoscaling.knative.dev/metric" in ann:
        values["kpa.metric"] = ann["autoscaling.knative.dev/metric"]
    for field, key in (("minReplicas", "replicas.min"), ("maxReplicas", "replicas.max")):
        if field in spec:
            values[key] = int(spec[field])
    if "containerConcurrency" in spec:
        values["kpa.container_concurrency"] = int(spec["containerConcurrency"])
    if "timeout" in spec:
        values["kpa.revision_timeout_s"] = float(spec["timeout"])


def _read_keda(objects: list[dict], scaled: dict, values: dict[str, Any], where: Path) -> None:
    spec = scaled["spec"]
    for field, key in (
        ("pollingInterval", "keda.polling_interval_s"),
        ("cooldownPeriod", "keda.cooldown_s"),
        ("initialCooldownPeriod", "keda.initial_cooldown_s"),
    ):
        if field in spec:
            values[key] = float(spec[field])
    values["replicas.min"] = int(spec.get("minReplicaCount", 0))
    values["replicas.max"] = int(spec.get("maxReplicaCount", 100))
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
    for direction in ("scaleUp", "scaleDown"):
        rules = behavior.get(direction)
        if not rules:
            continue
        prefix = "hpa.scale_up" if direction == "scaleUp" else "hpa.scale_down"
        if "stabilizationWindowSeconds" in rules:
            values[f"{prefix}.window_s"] = float(rules["stabilizationWindowSeconds"])
        if "policies" in rules:
            values[f"{prefix}.policies"] = ",".join(
                f"{p['type']}:{p['value']}:{p['periodSeconds']}" for p in rules["policies"]
            )
        if "selectPolicy" in rules:
            values[f"{prefix}.select"] = rules["selectPolicy"]
    for trigger in spec.get("triggers", []):
        meta = trigger.get("metadata", {})
        if trigger["type"] == "prometheus":
            values["keda.prom.threshold"] = float(meta["threshold"])
            values["keda.prom.activation"] = float(meta.get("activationThreshold", 0))
        elif trigger["type"] == "kafka":
            values["keda.kafka.lag_threshold"] = float(meta.get("lagThreshold", 10))
            values["keda.kafka.activation"] = float(meta.get("activationLagThreshold", 0))
        elif trigger["type"] == "external-push":
            http = _named(objects, "HTTPScaledObject", meta.get("httpScaledObject"))
            if http is None:
                raise SimulateError(f"{where}: trigger {trigger.get('name')!r} names no HTTPScaledObject")
            conc = http["spec"].get("scalingMetric", {}).get("concurrency", {})
            values["keda.http.target"] = float(conc.get("targetValue", 100))
            values["keda.http.scaledown_period_s"] = float(http["spec"].get("scaledownPeriod", 300))
            timeouts = http["spec"].get("timeouts", {})
            if "conditionWait" in timeouts:
                values["keda.http.wait_timeout_s"] = duration_s(
                    timeouts["conditionWait"], f"{where}: conditionWait"
                )
            if "responseHeader" in timeouts:
                values["keda.http.response_header_timeout_s"] = duration_s(
                    timeouts["responseHeader"], f"{where}: responseHeader"
                )


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set key=value`: the key must exist; the value is parsed as the key's type."""
    values = dict(values)
    for item in overrides:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq:
            raise SimulateError(f"--set {item!r}: expected key=value")
        if key not in KEYS:
            raise SimulateError(f"--set {key}: unknown key (known: {', '.join(KEYS)})")
        values[key] = parse_value(key, raw)
    return values


def cpus_over_time(raw: str) -> list[tuple[float, float]]:
    """node.cpus_over_time as (from seconds, cores), in time order."""
    steps = []
    for item in filter(None, (x.strip() for x in raw.split(","))):
        at, colon, cpus = item.partition(":")
        try:
            step = (float(at), float(cpus))
        except ValueError:
            step = None
        if not colon or step is None or step[1] < 0:
            raise SimulateError(f"node.cpus_over_time: {item!r} is not T:CPUS (seconds, cores >= 0)")
        steps.append(step)
    if any(b[0] < a[0] for a, b in itertools.pairwise(steps)):
        raise SimulateError(f"node.cpus_over_time: {raw!r}: the times go back")
    return steps


def parse_value(key: str, raw: str) -> Any:
    kind = type(KEYS[key][0])
    try:
        if kind is str:
            return raw
        if kind is bool:
            return {"true": True, "1": True, "false": False, "0": False}[raw.strip().lower()]
        if key.endswith("_s"):
            return duration_s(raw, f"--set {key}")
        return kind(float(raw)) if kind is int else kind(raw)
    except (ValueError, KeyError, SimulateError):
        raise SimulateError(f"--set {key}={raw!r}: expected a {kind.__name__}") from None
