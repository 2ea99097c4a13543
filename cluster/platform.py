"""The platform on the cluster: the pinned CRDs of every project our overlays name, and the KServe and
KEDA controllers with their admission webhooks, each built from its own Go module (cluster.build).

The controllers run as processes inside the node's namespaces (like the control plane), with a
cluster-admin kubeconfig, rather than as pods: no image has to be made for them and nothing differs for
the API server, which calls their webhooks over TLS at the node IP exactly as it would call a Service
(the webhook configurations are upstream's own, from the same module, with `url:` and our CA bundle in
place of cert-manager's Service reference). Aggregated APIs (KEDA's metrics server) get a Service
without selector whose EndpointSlice points at the node IP."""

from __future__ import annotations

import base64
import copy
import json
import os
from pathlib import Path
from typing import Any

from cluster import crds, gomod, node, pins, pki

KSERVE_WEBHOOK_PORT = 9443
KEDA_WEBHOOK_PORT = 9444
KEDA_METRICS_PORT = 7443  # the API server has 6443 in the same namespace
KEDA_GRPC_PORT = 9666


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def apply(objects: list[dict[str, Any]]) -> None:
    text = "\n".join(json.dumps(o) for o in objects)
    out = node.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=text, check=False)
    if out.returncode != 0:
        raise SystemExit(f"kubectl apply: {out.stderr.strip()[-3000:]}")


def install_crds() -> int:
    """Every CRD of every pinned project (server-side: some are larger than an annotation may hold)."""
    objects = [doc for _, _, doc in crds.crds()]
    for start in range(0, len(objects), 20):
        apply(objects[start : start + 20])
    names = [o["metadata"]["name"] for o in objects]
    out = node.kubectl(
        "wait", "--for=condition=Established", "--timeout=120s", *[f"crd/{n}" for n in names], check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"CRDs not established: {out.stderr.strip()}")
    return len(objects)


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _serving_cert(name: str, service: str, namespace: str) -> tuple[Path, Path]:
    directory = node.STATE / "pki"
    dns = (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )
    return pki.leaf(directory, name, f"{service}.{namespace}.svc", dns=dns, ips=(node.NODE_IP,))


def _ca_bundle() -> str:
    return base64.b64encode((node.STATE / "pki" / "ca.crt").read_bytes()).decode()


def webhook_configurations(path: Path, port: int, substitutions: dict[str, str]) -> list[dict[str, Any]]:
    """Upstream's webhook configurations, pointed at the node IP with our CA instead of a Service."""
    text = path.read_text()
    for key, value in substitutions.items():
        text = text.replace(key, value)
    import yaml

    found = []
    for doc in yaml.safe_load_all(text):
        if not isinstance(doc, dict) or not doc.get("kind", "").endswith("WebhookConfiguration"):
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"].pop("creationTimestamp", None)
        for hook in doc.get("webhooks", []):
            service = hook["clientConfig"].pop("service")
            hook["clientConfig"] = {
                "url": f"https://{node.NODE_IP}:{port}{service.get('path', '/')}",
                "caBundle": _ca_bundle(),
            }
        found.append(doc)
    return found


def _module(name: str) -> Path:
    comp = pins.components()[name]
    return gomod.module_dir(comp.module, comp.version)


def _env(extra: dict[str, str]) -> list[str]:
    return ["env", f"KUBECONFIG={node.STATE}/node-admin.kubeconfig", *[f"{k}={v}" for k, v in extra.items()]]


def start_kserve(record: node.Record) -> None:
    root = _module("kserve")
    apply([namespace("kserve")])
    configmap = next(
        d for d in _yaml_docs(root / "config/configmap/inferenceservice.yaml") if d["kind"] == "ConfigMap"
    )
    configmap["metadata"]["namespace"] = "kserve"
    # No Istio on this cluster: Serverless InferenceServices are reached at their Knative Service's
    # own address (through Kourier), not through a VirtualService KServe would otherwise write.
    ingress = json.loads(configmap["data"]["ingress"])
    ingress["disableIstioVirtualHost"] = True
    configmap["data"]["ingress"] = json.dumps(ingress, indent=1)
    apply([configmap])
    # controller-runtime reads its serving certificate from $TMPDIR/k8s-webhook-server/serving-certs.
    tmp = node.STATE / "kserve-tmp"
    certs = tmp / "k8s-webhook-server" / "serving-certs"
    certs.mkdir(parents=True, exist_ok=True)
    crt, key = _serving_cert("kserve-webhook", "kserve-webhook-server-service", "kserve")
    (certs / "tls.crt").write_bytes(crt.read_bytes())
    (certs / "tls.key").write_bytes(key.read_bytes())
    binary = node.bins()["kserve-manager"]
    node.start(
        record,
        "kserve-controller",
        [
            *_env({"TMPDIR": str(tmp), "POD_NAMESPACE": "kserve"}),
            str(binary), "--metrics-addr=127.0.0.1:8082", "--health-probe-addr=127.0.0.1:8083",
            f"--webhook-port={KSERVE_WEBHOOK_PORT}", "--leader-elect=false",
        ],
    )  # fmt: skip
    holder = record.data["pids"]["holder"]
    node.wait_for(
        "the KServe webhook server",
        lambda: (
            node.node_http_ok(
                holder, f"https://{node.NODE_IP}:{KSERVE_WEBHOOK_PORT}/healthz", insecure_tls=True
            )
            or _tls_listening(holder, KSERVE_WEBHOOK_PORT)
        ),
        180,
        record,
        "kserve-controller",
    )
    subs = {"$(webhookServiceName)": "kserve-webhook-server-service", "$(kserveNamespace)": "kserve"}
    apply(webhook_configurations(root / "config/webhook/manifests.yaml", KSERVE_WEBHOOK_PORT, subs))


def _tls_listening(holder: int, port: int) -> bool:
    # A webhook server answers 404 on "/": any HTTP status means it is up and serving TLS.
    import subprocess

    out = subprocess.run(
        [*node.in_node(holder), "curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "3",
         f"https://{node.NODE_IP}:{port}/"],
        capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip() not in ("", "000")


def start_keda_webhooks(record: node.Record) -> None:
    root = _module("keda")
    apply([namespace("keda")])
    certs = node.STATE / "keda-certs"
    certs.mkdir(parents=True, exist_ok=True)
    crt, key = _serving_cert("keda-webhook", "keda-admission-webhooks", "keda")
    (certs / "tls.crt").write_bytes(crt.read_bytes())
    (certs / "tls.key").write_bytes(key.read_bytes())
    (certs / "ca.crt").write_bytes((node.STATE / "pki" / "ca.crt").read_bytes())
    binary = node.bins()["keda-webhooks"]
    node.start(
        record,
        "keda-webhooks",
        [
            *_env({"POD_NAMESPACE": "keda", "KEDA_CLUSTER_OBJECT_NAMESPACE": "keda"}),
            str(binary), f"--cert-dir={certs}", f"--port={KEDA_WEBHOOK_PORT}",
            "--metrics-bind-address=127.0.0.1:8182", "--health-probe-bind-address=127.0.0.1:8183",
        ],
    )  # fmt: skip
    holder = record.data["pids"]["holder"]
    node.wait_for(
        "KEDA's webhook server",
        lambda: _tls_listening(holder, KEDA_WEBHOOK_PORT),
        180,
        record,
        "keda-webhooks",
    )
    subs = {"keda-admission-webhooks": "keda-admission-webhooks"}
    apply(webhook_configurations(root / "config/webhooks/validation_webhooks.yaml", KEDA_WEBHOOK_PORT, subs))


def node_service(name: str, namespace: str, port: int, target: int) -> list[dict[str, Any]]:
    """A Service without selector whose one endpoint is a process of the node (at the node IP)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"name": "main", "port": port, "targetPort": target, "protocol": "TCP"}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-node",
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "ttsk8s",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "main", "port": target, "protocol": "TCP"}],
            "endpoints": [{"addresses": [node.NODE_IP], "conditions": {"ready": True}}],
        },
    ]


def _keda_certs() -> Path:
    """One certificate for the operator's gRPC server and the metrics API server (KEDA reads ca.crt too)."""
    certs = node.STATE / "keda-certs"
    certs.mkdir(parents=True, exist_ok=True)
    names = ("keda-operator", "keda-metrics-apiserver", "keda-admission-webhooks")
    dns = tuple(f"{n}.keda{suffix}" for n in names for suffix in ("", ".svc", ".svc.cluster.local")) + names
    # Client and server at once: the adapter presents it to the operator's gRPC server (mutual TLS).
    crt, key = pki.leaf(
        node.STATE / "pki",
        "keda",
        "keda-operator.keda.svc",
        dns=dns,
        ips=(node.NODE_IP, "127.0.0.1"),
        client=True,
    )
    (certs / "tls.crt").write_bytes(crt.read_bytes())
    (certs / "tls.key").write_bytes(key.read_bytes())
    (certs / "ca.crt").write_bytes((node.STATE / "pki" / "ca.crt").read_bytes())
    return certs


KEDA_ENV = {"POD_NAMESPACE": "keda", "KEDA_CLUSTER_OBJECT_NAMESPACE": "keda", "WATCH_NAMESPACE": ""}


def start_keda_operator(record: node.Record) -> None:
    certs = _keda_certs()
    apply([namespace("keda"), *node_service("keda-operator", "keda", KEDA_GRPC_PORT, KEDA_GRPC_PORT)])
    node.start(
        record,
        "keda-operator",
        [
            *_env({**KEDA_ENV, "OPERATOR_NAME": "keda-operator"}),
            str(node.bins()["keda-operator"]), f"--cert-dir={certs}", "--enable-cert-rotation=false",
            "--enable-webhook-patching=false", "--leader-elect=false",
            f"--metrics-service-bind-address={node.NODE_IP}:{KEDA_GRPC_PORT}",
            "--metrics-bind-address=127.0.0.1:8282", "--health-probe-bind-address=127.0.0.1:8283",
            # Log times in nanoseconds (default ISO 8601: whole seconds): the e2e wake tests time
            # KEDA's scale from zero from its log (testing/wakes.py).
            "--zap-time-encoding=rfc3339nano",
        ],
    )  # fmt: skip
    holder = record.data["pids"]["holder"]
    node.wait_for(
        "the KEDA operator",
        lambda: node.node_http_ok(holder, "http://127.0.0.1:8283/readyz"),
        180,
        record,
        "keda-operator",
    )


def start_keda_adapter(record: node.Record) -> None:
    certs = _keda_certs()
    apply(node_service("keda-metrics-apiserver", "keda", 443, KEDA_METRICS_PORT))
    node.start(
        record,
        "keda-adapter",
        [
            *_env(KEDA_ENV),
            str(node.bins()["keda-adapter"]), f"--secure-port={KEDA_METRICS_PORT}", f"--bind-address={node.NODE_IP}",
            f"--tls-cert-file={certs}/tls.crt", f"--tls-private-key-file={certs}/tls.key",
            # Where the adapter also finds ca.crt for its gRPC client to the operator.
            f"--cert-dir={certs}",
            f"--authentication-kubeconfig={node.STATE}/node-admin.kubeconfig",
            f"--authorization-kubeconfig={node.STATE}/node-admin.kubeconfig",
            # Not in a pod: no in-cluster config, so the listers get the kubeconfig too.
            f"--lister-kubeconfig={node.STATE}/node-admin.kubeconfig",
            f"--metrics-service-address={node.NODE_IP}:{KEDA_GRPC_PORT}",
            "--metrics-service-grpc-authority=keda-operator.keda.svc.cluster.local", "--port=8284",
        ],
    )  # fmt: skip
    apply(
        [
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
                "spec": {
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "service": {"name": "keda-metrics-apiserver", "namespace": "keda", "port": 443},
                    "caBundle": _ca_bundle(),
                },
            }
        ]
    )
    node.wait_for(
        "KEDA's external metrics API",
        lambda: (
            node.kubectl("get", "--raw=/apis/external.metrics.k8s.io/v1beta1", check=False).returncode == 0
        ),
        180,
        record,
        "keda-adapter",
    )


HTTP_SCALER_PORT = 9090  # the port our ScaledObject's external-push scalerAddress names
HTTP_PROXY_PORT = 8080
HTTP_ADMIN_PORT = 9091  # 9090 is the scaler's in the same namespace


def start_http_add_on(record: node.Record) -> None:
    """The HTTP add-on's interceptor, external scaler and operator, with the Services our manifests name."""
    apply(
        [
            namespace("keda"),
            *node_service("keda-add-ons-http-external-scaler", "keda", HTTP_SCALER_PORT, HTTP_SCALER_PORT),
            *node_service("keda-add-ons-http-interceptor-admin", "keda", HTTP_ADMIN_PORT, HTTP_ADMIN_PORT),
            *node_service("keda-add-ons-http-interceptor-proxy", "keda", 8080, HTTP_PROXY_PORT),
        ]
    )
    binaries = node.bins()
    holder = record.data["pids"]["holder"]
    node.start(
        record,
        "http-interceptor",
        [
            *_env({"KEDA_HTTP_PROXY_PORT": str(HTTP_PROXY_PORT), "KEDA_HTTP_ADMIN_PORT": str(HTTP_ADMIN_PORT),
                   "OTEL_PROM_EXPORTER_PORT": "2223", "KEDA_HTTP_WATCH_NAMESPACE": ""}),
            str(binaries["http-add-on-interceptor"]),
        ],
    )  # fmt: skip
    node.start(
        record,
        "http-scaler",
        [
            *_env({"KEDA_HTTP_SCALER_PORT": str(HTTP_SCALER_PORT), "OTEL_PROM_EXPORTER_PORT": "2224",
                   "KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE": "keda",
                   "KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE": "keda-add-ons-http-interceptor-admin",
                   "KEDA_HTTP_SCALER_TARGET_ADMIN_DEPLOYMENT": "keda-add-ons-http-interceptor",
                   # Joined to each endpoint's address as is: the admin port itself, not a Service port.
                   "KEDA_HTTP_SCALER_TARGET_ADMIN_PORT": str(HTTP_ADMIN_PORT)}),
            str(binaries["http-add-on-scaler"]),
        ],
    )  # fmt: skip
    node.start(
        record,
        "http-operator",
        [
            *_env({"KEDA_HTTP_OPERATOR_EXTERNAL_SCALER_SERVICE": "keda-add-ons-http-external-scaler",
                   "KEDA_HTTP_OPERATOR_EXTERNAL_SCALER_PORT": str(HTTP_SCALER_PORT),
                   "KEDA_HTTP_OPERATOR_NAMESPACE": "keda"}),
            str(binaries["http-add-on-operator"]), "--metrics-bind-address=127.0.0.1:8380",
            "--health-probe-bind-address=127.0.0.1:8381",
        ],
    )  # fmt: skip
    node.wait_for(
        "the HTTP add-on operator", lambda: node.node_http_ok(holder, "http://127.0.0.1:8381/readyz"), 120, record,
        "http-operator",
    )  # fmt: skip
    node.wait_for(
        "the HTTP add-on interceptor",
        lambda: http_status(holder, f"http://{node.NODE_IP}:{HTTP_PROXY_PORT}/") not in ("", "000"),
        120,
        record,
        "http-interceptor",
    )


def http_status(holder: int, url: str) -> str:
    import subprocess

    out = subprocess.run(
        [*node.in_node(holder), "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "3", url],
        capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip()


def install(record: node.Record, require_all: bool = True) -> list[str]:
    """CRDs, then every controller whose binary exists; returns what could not start and why."""
    missing = []
    count = install_crds()
    node.log(f"{count} CRDs established")
    have = node.bins()
    starters = (
        ("kserve-manager", start_kserve),
        ("keda-webhooks", start_keda_webhooks),
        ("keda-operator", start_keda_operator),
        ("keda-adapter", start_keda_adapter),
        ("http-add-on-operator", start_http_add_on),
    )
    for binary, starter in starters:
        if binary in have:
            starter(record)
            node.log(f"{starter.__name__.removeprefix('start_')} up")
        else:
            missing.append(f"{binary}: not built yet (python -m cluster.build)")
    if missing and require_all:
        raise SystemExit("platform incomplete: " + "; ".join(missing))
    return missing


if __name__ == "__main__":
    import sys

    rec = node.Record()
    print(
        "\n".join(install(rec, require_all=os.environ.get("CLUSTER_PLATFORM") != "available"))
        or "platform up"
    )
    sys.exit(0)
