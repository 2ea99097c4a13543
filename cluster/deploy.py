"""`make cluster-deploy FLAVOUR=keda|knative`: our image and what it needs in the cluster of `make cluster`,
then the flavour's e2e overlay (keda/overlays/e2e or knative/overlays/e2e), applied and waited for. The
knative flavour first installs Knative Serving and Kourier (cluster.knative).

What a real cluster has and this one lacks is supplied on the node, as the platform's controllers are
(cluster.platform), each behind the Service name our manifests use:
- the image: `make image`, saved by podman and imported into containerd's k8s.io namespace (no registry);
- the voice store: moto's S3 on the node, Service `voice-store.tts`, with the default voice published
  to it from the host through a loopback port, as `make run` publishes it;
- Prometheus: Debian's, on the node, scraping the predictor pods with the selector, port, path and
  interval of our PodMonitor (the Prometheus Operator does not run here), behind
  `prometheus-operated.monitoring`, the address of the ScaledObject's prometheus trigger. Debian builds
  it without Kubernetes discovery, so cluster.pod_discovery serves the same pod targets over HTTP SD.

Prints `URL=http://127.0.0.1:<port>` and `HOST=<host>` last: a request to URL with that Host header goes
the flavour's 0 -> 1 path: the HTTP add-on's interceptor (keda), or Kourier and Knative's activator
(knative). Run again, it reuses what is up and re-applies the overlay; the other flavour's objects are
removed first (both use namespace tts). Run: python -m cluster.deploy keda|knative"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster import node, platform, pod_discovery

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "dev.local/tts-predictor:e2e"  # keda/overlays/e2e names it
NAMESPACE = "tts"
S3_PORT = 9000  # on the node IP, behind Service voice-store.tts
VOICE_STORE_URL = f"http://voice-store.{NAMESPACE}.svc:{S3_PORT}"  # keda/overlays/e2e's AWS_ENDPOINT_URL
PROMETHEUS_SERVICE_PORT = 9090  # the port of the prometheus trigger's serverAddress
PROMETHEUS_PORT = 9190  # on the node IP (the HTTP add-on's scaler has 9090 there)
DISCOVERY = "127.0.0.1:9095"  # cluster.pod_discovery, inside the node
# Seconds between discovery refreshes: a new pod is scraped this long after it has an IP at most.
DISCOVERY_REFRESH = "5s"
# Host ports on 127.0.0.1 (the only way in): the interceptor's proxy and the voice store.
INTERCEPTOR_HOST_PORT = int(os.environ.get("CLUSTER_HTTP_PORT", "16080"))
KOURIER_HOST_PORT = int(os.environ.get("CLUSTER_KOURIER_PORT", "16081"))
S3_HOST_PORT = int(os.environ.get("CLUSTER_S3_PORT", "16900"))
# Buckets the manifests write to (shadow records, event outputs); moto starts empty.
BUCKETS = ("voices", "tts-shadow", "tts-events")


def _ours(record: node.Record, name: str) -> None:
    """Mark `name` as the deployment's process, not the cluster's (node.Record.cluster_pids)."""
    record.data.setdefault("deployed", [])
    if name not in record.data["deployed"]:
        record.data["deployed"].append(name)


def start(record: node.Record, name: str, cmd: list[str]) -> None:
    """A process of ours in the node (node.start)."""
    _ours(record, name)
    node.start(record, name, cmd)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def forward(record: node.Record, name: str, host_port: int, target: str) -> None:
    """127.0.0.1:host_port -> target inside the node (cluster.loopback), once."""
    if _started(record, name) and _listening(host_port):
        return
    _ours(record, name)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.loopback", f"/run/netns/{node.NETNS}", f"{host_port}:{target}"],
        cwd=ROOT,
        stdout=(node.STATE / "logs" / f"{name}.log").open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    record.pid(name, proc.pid)
    node.wait_for(f"127.0.0.1:{host_port} ({name})", lambda: _listening(host_port), 30, record, name)


def _started(record: node.Record, name: str) -> bool:
    pid = record.data["pids"].get(name)
    return bool(pid and node.alive(pid))


# --- the image -----------------------------------------------------------------------------------


def _podman_image_id(name: str) -> str:
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", name], capture_output=True, text=True
    )
    return out.stdout.strip() if out.returncode == 0 else ""


def import_image(record: node.Record) -> str:
    """`make image` as IMAGE, imported into containerd unless that very build is there already."""
    node.log(f"building {IMAGE} (make image)")
    subprocess.run([sys.executable, "-m", "tts_ops.image", "build", "--tag", IMAGE], cwd=ROOT, check=True)
    image_id = _podman_image_id(IMAGE)
    listed = node.ctr("images", "ls", "-q").stdout.split()
    if record.data.get("predictor_image") == image_id and IMAGE in listed:
        return image_id
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=node.STATE) as tmp:
        archive = Path(tmp) / "predictor.tar"
        # docker-archive carries RepoTags, from which containerd names the image.
        subprocess.run(
            ["podman", "save", "--format", "docker-archive", "-o", str(archive), IMAGE],
            check=True,
            capture_output=True,
        )
        out = node.ctr("images", "import", "--no-unpack=false", str(archive))
        if out.returncode != 0:
            raise SystemExit(f"ctr images import {IMAGE}: {out.stderr.strip()}")
    record.data["predictor_image"] = image_id
    record.save()
    node.log(f"{IMAGE} imported into containerd in {time.monotonic() - started:.1f}s")
    return image_id


# --- the voice store -----------------------------------------------------------------------------


def start_voice_store(record: node.Record) -> None:
    holder = record.data["pids"]["holder"]
    if not _started(record, "voice-store"):
        # moto takes the first label of a Host it does not know for a bucket (virtual-hosted style):
        # told the Service's name is an endpoint, it reads voice-store.tts.svc as one.
        env = ["env", f"MOTO_S3_CUSTOM_ENDPOINTS={VOICE_STORE_URL}"]
        start(
            record,
            "voice-store",
            [*env, sys.executable, "-m", "moto.server", "-H", node.NODE_IP, "-p", str(S3_PORT)],
        )
        node.wait_for(
            "the voice store (moto)",
            lambda: platform.http_status(holder, f"http://{node.NODE_IP}:{S3_PORT}/") not in ("", "000"),
            60,
            record,
            "voice-store",
        )
    platform.apply(
        [platform.namespace(NAMESPACE), *platform.node_service("voice-store", NAMESPACE, S3_PORT, S3_PORT)]
    )
    forward(record, "voice-store-loopback", S3_HOST_PORT, f"{node.NODE_IP}:{S3_PORT}")
    endpoint = f"http://127.0.0.1:{S3_HOST_PORT}"
    from testing.s3 import VOICE_URI, aws_env, build_voice, publish_voice, s3_client

    os.environ.update(aws_env(endpoint))
    client = s3_client(endpoint)
    have = {b["Name"] for b in client.list_buckets()["Buckets"]}
    for bucket in set(BUCKETS) - have:
        client.create_bucket(Bucket=bucket)
    published = client.list_objects_v2(Bucket="voices", Prefix=VOICE_URI.removeprefix("s3://voices/") + "/")
    if not published.get("KeyCount"):
        publish_voice(build_voice(node.STATE / "voice"), VOICE_URI, endpoint)
        node.log(f"published {VOICE_URI} to the voice store")


# --- Prometheus ----------------------------------------------------------------------------------


def scrape_configs(podmonitors: list[dict[str, Any]], discovery: str) -> list[dict[str, Any]]:
    """What the Prometheus Operator makes of each PodMonitor: pod discovery in its namespace, kept by its
    selector and endpoint port, labelled namespace/pod/container as the operator labels them (the
    discovery is cluster.pod_discovery at `discovery`, host:port, with the labels of `role: pod`)."""
    jobs = []
    for monitor in podmonitors:
        namespace = monitor["metadata"].get("namespace", "default")
        selector = monitor["spec"]["selector"]
        keep = []
        for key, value in selector.get("matchLabels", {}).items():
            keep.append((key, value))
        for expr in selector.get("matchExpressions", []):
            if expr["operator"] != "In":
                raise ValueError(
                    f"PodMonitor {monitor['metadata']['name']}: operator {expr['operator']} not supported"
                )
            keep.append((expr["key"], "|".join(expr["values"])))
        for index, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
            relabel = [
                {
                    "source_labels": [f"__meta_kubernetes_pod_label_{pod_discovery.label_name(key)}"],
                    "regex": regex,
                    "action": "keep",
                }
                for key, regex in keep
            ]
            relabel += [
                {
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": endpoint["port"],
                    "action": "keep",
                },
                # Pods that finished (a scale-down) are still discovered for a while.
                {
                    "source_labels": ["__meta_kubernetes_pod_phase"],
                    "regex": "(Failed|Succeeded)",
                    "action": "drop",
                },
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            ]
            jobs.append(
                {
                    "job_name": f"podMonitor/{namespace}/{monitor['metadata']['name']}/{index}",
                    "metrics_path": endpoint.get("path", "/metrics"),
                    "scrape_interval": endpoint.get("interval", "30s"),
                    "http_sd_configs": [
                        {
                            "url": f"http://{discovery}/?namespace={namespace}",
                            "refresh_interval": DISCOVERY_REFRESH,
                        }
                    ],
                    "relabel_configs": relabel,
                }
            )
    return jobs


def start_prometheus(record: node.Record, objects: list[dict[str, Any]]) -> None:
    monitors = [o for o in objects if o["kind"] == "PodMonitor"]
    config = {
        "global": {"scrape_interval": "10s", "evaluation_interval": "10s"},
        "scrape_configs": scrape_configs(monitors, DISCOVERY),
    }
    if not _started(record, "pod-discovery"):
        kubeconfig = node.STATE / "node-admin.kubeconfig"
        start(
            record,
            "pod-discovery",
            [
                sys.executable,
                "-m",
                "cluster.pod_discovery",
                str(node.kubectl_path()),
                str(kubeconfig),
                DISCOVERY,
            ],
        )
    path = node.STATE / "prometheus.yml"
    text = json.dumps(config, indent=1)  # YAML is a superset of JSON
    holder = record.data["pids"]["holder"]
    if _started(record, "prometheus") and path.exists() and path.read_text() == text:
        return
    if _started(record, "prometheus"):
        node.run("kill", str(record.data["pids"]["prometheus"]))
    path.write_text(text)
    data = node.STATE / "prometheus-data"
    data.mkdir(exist_ok=True)
    start(
        record,
        "prometheus",
        [
            "prometheus", f"--config.file={path}", f"--storage.tsdb.path={data}",
            f"--web.listen-address={node.NODE_IP}:{PROMETHEUS_PORT}", "--storage.tsdb.retention.time=2h",
        ],
    )  # fmt: skip
    node.wait_for(
        "Prometheus",
        lambda: node.node_http_ok(holder, f"http://{node.NODE_IP}:{PROMETHEUS_PORT}/-/ready"),
        60,
        record,
        "prometheus",
    )
    platform.apply(
        [
            platform.namespace("monitoring"),
            *platform.node_service(
                "prometheus-operated", "monitoring", PROMETHEUS_SERVICE_PORT, PROMETHEUS_PORT
            ),
        ]
    )


# --- the flavour ---------------------------------------------------------------------------------


def wait_keda_at_rest(record: node.Record, objects: list[dict[str, Any]]) -> None:
    """The stable predictor's Deployment, owned by the ScaledObject, at zero; the canary ready."""
    from testing.kube import Cluster, at_zero, condition_true

    cluster = Cluster(str(node.kubectl_path()), str(node.admin_kubeconfig()))
    scaled = next(o for o in objects if o["kind"] == "ScaledObject")
    name, target = scaled["metadata"]["name"], scaled["spec"]["scaleTargetRef"]["name"]
    node.wait_for(
        f"ScaledObject {name} Ready",
        lambda: condition_true(cluster.get("-n", NAMESPACE, "scaledobject", name) or {}, "Ready"),
        180,
    )
    node.wait_for(
        f"Deployment {target}", lambda: cluster.get("-n", NAMESPACE, "deployment", target) is not None, 180
    )
    # The canary is always on (one pod): its readiness proves image, voice store and probes.
    node.wait_rollout(NAMESPACE, "deployment/tts-canary-predictor", 300)
    node.wait_for(f"Deployment {target} at zero replicas", lambda: at_zero(cluster), 240)


def wait_knative_at_rest(objects: list[dict[str, Any]]) -> str:
    """The stable InferenceService Ready (its Knative Service, Route and Kourier ingress with it) and
    then at zero; the canary ready. Returns the InferenceService's host."""
    from testing.kube import Cluster, at_zero, condition_true

    cluster = Cluster(str(node.kubectl_path()), str(node.admin_kubeconfig()))
    name = next(
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "InferenceService"
        and o["metadata"].get("annotations", {}).get("serving.kserve.io/deploymentMode") == "Serverless"
    )
    node.wait_for(
        f"InferenceService {name} Ready",
        lambda: condition_true(cluster.get("-n", NAMESPACE, "inferenceservice", name) or {}, "Ready"),
        300,
    )
    node.wait_rollout(NAMESPACE, "deployment/tts-canary-predictor", 300)
    node.wait_for("the stable predictor at zero", lambda: at_zero(cluster), 240)
    url = (cluster.get("-n", NAMESPACE, "inferenceservice", name) or {})["status"]["url"]
    return url.split("://", 1)[1].split("/", 1)[0]


def _switch_flavour(record: node.Record, flavour: str) -> None:
    """Both flavours name the same objects in one namespace: the other one's go first."""
    previous = record.data.get("flavour")
    if previous and previous != flavour:
        node.log(f"removing the {previous} flavour's namespace {NAMESPACE}")
        node.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=300s", check=False)
    record.data["flavour"] = flavour
    record.save()


def deploy(flavour: str) -> int:
    if flavour not in ("keda", "knative"):
        raise SystemExit(f"FLAVOUR={flavour}: keda or knative")
    if not node.is_up():
        raise SystemExit("no cluster is up: run `make cluster` first")
    started = time.monotonic()
    record = node.Record()
    if flavour == "knative":
        from cluster import knative

        knative.install(record)
    _switch_flavour(record, flavour)
    import_image(record)
    start_voice_store(record)
    overlay = ROOT / flavour / "overlays" / "e2e"
    from tts_ops.kustomize import render

    objects = render(overlay)
    start_prometheus(record, objects)
    platform.apply(objects)
    if flavour == "keda":
        wait_keda_at_rest(record, objects)
        forward(
            record,
            "interceptor-loopback",
            INTERCEPTOR_HOST_PORT,
            f"{node.NODE_IP}:{platform.HTTP_PROXY_PORT}",
        )
        host = next(o for o in objects if o["kind"] == "HTTPScaledObject")["spec"]["hosts"][0]
        port = INTERCEPTOR_HOST_PORT
    else:
        host = wait_knative_at_rest(objects)
        # Kourier's cluster-local listener (the InferenceService's host is a svc.cluster.local one),
        # through its Service's ClusterIP: kube-proxy picks the gateway pod, as for any in-cluster caller.
        gateway = node.kubectl(
            "-n", "kourier-system", "get", "service", "kourier-internal", "-o", "jsonpath={.spec.clusterIP}"
        ).stdout.strip()
        forward(record, "kourier-loopback", KOURIER_HOST_PORT, f"{gateway}:80")
        port = KOURIER_HOST_PORT
    node.log(f"{flavour} flavour deployed in {time.monotonic() - started:.0f}s, predictor at zero")
    print(f"URL=http://127.0.0.1:{port}")
    print(f"HOST={host}")
    return 0


if __name__ == "__main__":
    sys.exit(deploy(sys.argv[1] if len(sys.argv) > 1 else "keda"))
