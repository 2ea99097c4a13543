"""The CustomResourceDefinitions of every pinned project, read from that project's own Go module at
the pinned version (`go mod download` puts it in the module cache; nothing is copied into the repo).
`make cluster` installs them; `cluster.schemas` converts them to the JSON schemas tts_ops/manifests.py
validates against offline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cluster import pins
from cluster.gomod import module_dir


def crd_files(comp: pins.Component) -> list[Path]:
    root = module_dir(comp.module, comp.version)
    files: list[Path] = []
    for entry in comp.crds:
        path = root / entry
        found = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
        files += [f for f in found if f.name != "kustomization.yaml"]
    return files


def crds() -> Iterator[tuple[pins.Component, Path, dict[str, Any]]]:
    """Every CRD document of every pinned component, with where it came from."""
    import yaml  # PyYAML: only this module and the schema generator need it (run from the venv)

    class Loader(yaml.SafeLoader):
        """YAML 1.1 reads a bare `=` (an enum value in some CRDs) as the `value` tag: keep it a string."""

    Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))
    for comp in pins.components().values():
        for file in crd_files(comp):
            for doc in yaml.load_all(file.read_text(), Loader=Loader):
                # Some files hold kustomize patches of a CRD (no spec.group): not a definition.
                if (
                    isinstance(doc, dict)
                    and doc.get("kind") == "CustomResourceDefinition"
                    and "group" in doc.get("spec", {})
                ):
                    yield comp, file, doc
