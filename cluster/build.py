"""Build every pinned Go component from its wrapper module into the versioned binary folder of the
user cache (cluster.pins.bin_dir), and log each binary's build time.

Go's own module and build caches (GOMODCACHE, GOCACHE) are shared by every clone on the machine; the
binary folder's name hashes the pins, the wrapper go.mod/go.sum, the Go version and the flags, so a
second clone finds the binaries and an edited pin builds into a new folder. A binary is written under a
temporary name and renamed, so an interrupted build never leaves a half-written one.
Run: python -m cluster.build [group ...]; prints `<group> <bin dir>` per group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cluster import pins

# Kubernetes reports what these variables hold (`kubectl version`, /version); Knative refuses v0.0.0.
VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
ORDER = (
    "kubernetes",
    "coredns",
    "kserve",
    "keda",
    "http-add-on",
    "knative-serving",
    "net-kourier",
    "knative-eventing",
)
# The kubernetes binaries the cluster needs first come first, so `make cluster` can start early.
FIRST = ("etcd", "kube-apiserver", "kubectl", "kube-controller-manager", "kube-scheduler", "kubelet")


def _module_time(comp: pins.Component) -> str:
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{comp.module}@{comp.version}"],
        capture_output=True,
        text=True,
        check=True,
    )
    info = json.loads(Path(json.loads(out.stdout)["Info"]).read_text())
    return info.get("Time", "1970-01-01T00:00:00Z").replace(".000Z", "Z")


def ldflags(comp: pins.Component) -> str:
    flags = ["-s", "-w"]
    if comp.module == "k8s.io/kubernetes":
        major, minor = comp.version.lstrip("v").split(".")[:2]
        date = _module_time(comp)
        for package in VERSION_PACKAGES:
            flags += [
                f"-X {package}.gitVersion={comp.version}",
                f"-X {package}.gitMajor={major}",
                f"-X {package}.gitMinor={minor}",
                f"-X {package}.gitTreeState=clean",
                f"-X {package}.buildDate={date}",
            ]
    elif comp.module == "github.com/kedacore/keda/v2":
        flags.append(f"-X github.com/kedacore/keda/v2/version.Version={comp.version}")
    return " ".join(flags)


def flags_key(group: pins.Group) -> str:
    return "CGO_ENABLED=0 -trimpath " + ";".join(ldflags_static(c) for c in group.members)


def ldflags_static(comp: pins.Component) -> str:
    """ldflags without the date lookup (it needs the network on a cold module cache)."""
    return f"{comp.module}@{comp.version}:{'k8s-version' if comp.module == 'k8s.io/kubernetes' else ''}"


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def build_group(group: pins.Group, log: Path) -> Path:
    out_dir = pins.bin_dir(group, flags_key(group))
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
    work = [
        (comp, pkg, name)
        for comp in group.members
        for pkg, name in zip(comp.package_paths(), comp.binary_names(), strict=True)
    ]
    work.sort(key=lambda item: FIRST.index(item[2]) if item[2] in FIRST else len(FIRST))
    for comp, package, name in work:
        target = out_dir / name
        if target.exists():
            continue
        tmp = out_dir / f".{name}.tmp"
        start, load = time.monotonic(), _loadavg()
        cmd = ["go", "build", "-trimpath", "-ldflags", ldflags(comp), "-o", str(tmp), package]
        result = subprocess.run(cmd, cwd=group.folder, env=env, check=False)
        seconds = time.monotonic() - start
        status = "ok" if result.returncode == 0 else f"failed rc={result.returncode}"
        line = (
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {group.name} {name} {comp.module}@{comp.version}"
            f" {seconds:.0f}s {status} load_before={load} load_after={_loadavg()} cores={os.cpu_count()}\n"
        )
        with log.open("a") as handle:
            handle.write(line)
        print(line, end="", flush=True)
        if result.returncode != 0:
            raise SystemExit(f"build of {package} failed (rc {result.returncode})")
        tmp.rename(target)
    return out_dir


def bin_dirs() -> dict[str, Path]:
    groups = pins.groups()
    return {name: pins.bin_dir(groups[name], flags_key(groups[name])) for name in ORDER if name in groups}


def main(argv: list[str]) -> int:
    groups = pins.groups()
    log = pins.user_cache() / "build-times.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for name in argv or [n for n in ORDER if n in groups]:
        if name not in groups:
            raise SystemExit(f"unknown build group {name!r}; known: {', '.join(groups)}")
        if not (groups[name].folder / "go.mod").exists():
            raise SystemExit(f"{groups[name].folder}/go.mod missing: run python -m cluster.gomod {name}")
        print(f"{name} {build_group(groups[name], log)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
