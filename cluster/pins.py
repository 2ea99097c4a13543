"""The pinned versions (cluster/versions.toml) and the names derived from them: build groups, their
wrapper-module folders, and the versioned binary folder in the user cache."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSIONS = HERE / "versions.toml"
MODULES = HERE / "modules"


@dataclass(frozen=True)
class Component:
    name: str
    module: str
    version: str
    reason: str
    packages: tuple[str, ...] = ()
    crds: tuple[str, ...] = ()
    group: str = ""
    staging_version: str = ""

    def package_paths(self) -> list[str]:
        return [self.module if p == "." else f"{self.module}/{p}" for p in self.packages]

    def binary_names(self) -> list[str]:
        # A binary is named after its package's last element (etcd's would be "v3"); the platform's
        # carry their project's name, since KEDA and the HTTP add-on both have an "operator".
        rename = {"go.etcd.io/etcd/server/v3": "etcd"}
        names = [rename.get(p, p.rsplit("/", 1)[-1]) for p in self.package_paths()]
        if self.group in ("kubernetes", "coredns"):
            return names
        return [f"{self.group}-{name}" for name in names]


@dataclass
class Group:
    """One wrapper Go module: a main project (its go.mod is the template) and extra components."""

    name: str
    main: Component
    members: list[Component] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        return MODULES / self.name


def components() -> dict[str, Component]:
    data = tomllib.loads(VERSIONS.read_text())
    found = {}
    for name, entry in data.items():
        if "module" not in entry:
            continue
        found[name] = Component(
            name=name,
            module=entry["module"],
            version=entry["version"],
            reason=entry["reason"],
            packages=tuple(entry.get("packages", ())),
            crds=tuple(entry.get("crds", ())),
            group=entry.get("group", name if entry.get("packages") else ""),
            staging_version=entry.get("staging_version", ""),
        )
    return found


def debian_packages() -> list[str]:
    return list(tomllib.loads(VERSIONS.read_text())["debian"]["packages"])


def groups() -> dict[str, Group]:
    found: dict[str, Group] = {}
    for comp in components().values():
        if not comp.group:
            continue
        if comp.group == comp.name:
            found.setdefault(comp.name, Group(comp.name, comp)).main = comp
    for comp in components().values():
        if comp.group:
            found[comp.group].members.append(comp)
    return found


def go_version() -> str:
    return subprocess.run(
        ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True
    ).stdout.strip()


def user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tts-predictor" / "cluster"


def group_hash(group: Group, flags: str) -> str:
    """What the binaries depend on: the pins, the wrapper go.mod/go.sum, the Go toolchain, the flags."""
    digest = hashlib.sha256()
    for comp in group.members:
        digest.update(f"{comp.module}@{comp.version}:{','.join(comp.packages)}\n".encode())
    for name in ("go.mod", "go.sum"):
        file = group.folder / name
        digest.update(file.read_bytes() if file.exists() else b"-")
    digest.update(go_version().encode())
    digest.update(flags.encode())
    return digest.hexdigest()[:12]


def bin_dir(group: Group, flags: str) -> Path:
    return user_cache() / f"{group.name}-{group_hash(group, flags)}" / "bin"
