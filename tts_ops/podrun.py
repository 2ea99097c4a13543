"""Run the image as a rendered manifest runs it: the pod's container spec as `podman run` flags.

The container spec is read from the rendered overlay (knative/overlays/cpu by default), never from a
second copy: env values, securityContext, resource limits and the emptyDir volumes with their size
limits. What differs from a pod, and why:

* the network is the host's (`--network host`): the local S3 (moto) listens on 127.0.0.1, and several
  predictors may share this machine, so HTTP_PORT and GRPC_PORT are set to free ports;
* emptyDirs are tmpfs mounts of the manifest's `sizeLimit` (on a node, a disk emptyDir past its limit
  gets the pod evicted; a tmpfs refuses the write: both stop a voice that does not fit);
* the `envFrom` secret (AWS endpoint and credentials) is passed as the variables it would hold.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

from tts_ops.image import ROOT, podman_flags

# The one place the manifest renderer is imported for the image's tests and benchmark.
from tts_ops.kustomize import render
from tts_ops.manifests import predictor_container

OVERLAY = "knative/overlays/cpu"
ISVC = "tts"

_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_FACTORS.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40})


def quantity_bytes(value: str) -> int:
    """A Kubernetes quantity ('1Gi', '256Mi', '2G') in bytes."""
    match = _QUANTITY.match(str(value))
    if not match:
        raise ValueError(f"not a byte quantity: {value!r}")
    return int(float(match.group(1)) * _FACTORS[match.group(2)])


@dataclass(frozen=True)
class PodSpec:
    """What `podman run` needs from one rendered container."""

    env: dict[str, str]
    # mountPath -> sizeLimit in bytes, for each emptyDir the container mounts.
    empty_dirs: dict[str, int]
    # securityContext and resource limits as podman flags.
    flags: list[str] = field(default_factory=list)
    user: int = 0


def manifest_pod(overlay: str = OVERLAY, name: str = ISVC) -> PodSpec:
    isvc = next(
        o for o in render(ROOT / overlay) if o["kind"] == "InferenceService" and o["metadata"]["name"] == name
    )
    container = predictor_container(isvc)
    volumes = {v["name"]: v for v in isvc["spec"]["predictor"].get("volumes", [])}
    empty_dirs = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" not in volume:
            raise ValueError(f"volume {mount['name']}: only emptyDir volumes can be run here")
        empty_dirs[mount["mountPath"]] = quantity_bytes(volume["emptyDir"]["sizeLimit"])
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    security: dict[str, Any] = container.get("securityContext", {})
    user = int(security.get("runAsUser", 0))
    if security.get("runAsNonRoot") and user == 0:
        raise ValueError("runAsNonRoot without a runAsUser: the image's USER would decide")
    flags = ["--user", str(user)]
    if security.get("readOnlyRootFilesystem"):
        # Without --read-only-tmpfs=false podman adds writable tmpfs at /run, /tmp and /var/tmp; a pod
        # gets only its volumes.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if security.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    for cap in security.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", cap]
    for cap in security.get("capabilities", {}).get("add", []):
        flags += ["--cap-add", cap]
    limits = container.get("resources", {}).get("limits", {})
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        flags += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
    if "memory" in limits:
        flags += ["--memory", str(quantity_bytes(limits["memory"]))]
    return PodSpec(env=env, empty_dirs=empty_dirs, flags=flags, user=user)


def run_args(
    spec: PodSpec,
    image: str,
    name: str,
    env: dict[str, str],
    sizes: dict[str, int] | None = None,
) -> list[str]:
    """`podman run -d` for ``spec``; ``env`` is added to (and overrides) the manifest's, ``sizes``
    overrides emptyDir limits by mountPath."""
    args = ["podman", "run", "-d", "--name", name, *podman_flags(), "--network", "host", *spec.flags]
    for path, size in {**spec.empty_dirs, **(sizes or {})}.items():
        # exec: an emptyDir is not mounted noexec, podman's --tmpfs default is.
        args += ["--tmpfs", f"{path}:rw,exec,nosuid,nodev,size={size},mode=1777"]
    for key, value in {**spec.env, **env}.items():
        args += ["--env", f"{key}={value}"]
    return [*args, image]


def remove(name: str) -> None:
    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
