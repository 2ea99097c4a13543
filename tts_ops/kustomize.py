"""Render a kustomization of this repository's deploy tree (knative/, keda/, deploy/) to objects.

`render` runs `kubectl kustomize` when kubectl is on PATH, and otherwise `render_kustomization`, a
renderer for the part of kustomize our tree uses: resources, components, namespace, namePrefix and
nameSuffix, JSON 6902 patches (add, replace, remove, test) and replacements (a field copied from one
object into others). Anything else in a kustomization is refused rather than rendered differently
from kustomize; tts_ops/manifests.py's tests check that the two renderers agree.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

# Kinds kustomize's namespace transformer leaves alone.
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"})
SUPPORTED_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "resources",
        "components",
        "patches",
        "namespace",
        "namePrefix",
        "nameSuffix",
        "replacements",
    }
)
_SELECTOR_FIELDS = frozenset({"group", "version", "kind", "name", "namespace", "annotationSelector"})


class RenderError(Exception):
    """The folder is not a kustomization this renderer (or kubectl) can render; says which file and why."""


@dataclass
class _Resource:
    obj: Obj
    # The name the object was loaded with: kustomize matches patch targets and replacement
    # selectors against it too, so a suffixed copy (tts-canary) still answers to `tts`.
    original_name: str = ""

    def __post_init__(self) -> None:
        self.original_name = self.original_name or self.obj["metadata"]["name"]


def render(directory: Path) -> list[Obj]:
    """The objects of one kustomization folder, with `kubectl kustomize` when it is installed."""
    if shutil.which("kubectl"):
        return render_with_kubectl(directory)
    return render_kustomization(directory)


def render_with_kubectl(directory: Path) -> list[Obj]:
    result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RenderError(f"kubectl kustomize {directory}: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_kustomization(directory: Path) -> list[Obj]:
    """The objects of one kustomization folder, rendered in Python (no kubectl)."""
    return [r.obj for r in _build(Path(directory))]


def _build(path: Path) -> list[_Resource]:
    spec = _load_kustomization(path)
    resources: list[_Resource] = []
    for entry in spec.get("resources", []):
        target = (path / entry).resolve()
        if target.is_dir():
            resources += _build(target)
        else:
            resources += [
                _Resource(copy.deepcopy(doc)) for doc in yaml.safe_load_all(target.read_text()) if doc
            ]
    for entry in spec.get("components", []):
        component = (path / entry).resolve()
        component_spec = _load_kustomization(component, kind="Component")
        if set(component_spec) - {"apiVersion", "kind", "patches"}:
            raise RenderError(f"{component}: a Component may only hold patches in this renderer")
        _apply_patches(resources, component_spec, component)
    # kustomize's order within one kustomization: patches, namespace, prefix/suffix, replacements last.
    _apply_patches(resources, spec, path)
    for resource in resources:
        meta = resource.obj["metadata"]
        if spec.get("namePrefix") or spec.get("nameSuffix"):
            meta["name"] = f"{spec.get('namePrefix', '')}{meta['name']}{spec.get('nameSuffix', '')}"
        if spec.get("namespace") and resource.obj["kind"] not in CLUSTER_SCOPED:
            meta["namespace"] = spec["namespace"]
    for replacement in spec.get("replacements", []):
        _apply_replacement(resources, replacement, path)
    return resources


def _load_kustomization(path: Path, kind: str = "Kustomization") -> Obj:
    file = path / "kustomization.yaml"
    if not file.is_file():
        raise RenderError(f"{path}: no kustomization.yaml")
    spec = yaml.safe_load(file.read_text()) or {}
    if spec.get("kind", "Kustomization") != kind:
        raise RenderError(f"{file}: expected kind {kind}, found {spec.get('kind')}")
    unsupported = set(spec) - SUPPORTED_FIELDS
    if unsupported:
        # Refuse rather than silently render something kustomize would render differently.
        raise RenderError(f"{file}: fields {sorted(unsupported)} are not supported by the fallback renderer")
    return spec


def _apply_patches(resources: list[_Resource], spec: Obj, base: Path) -> None:
    for patch in spec.get("patches", []):
        text = patch["patch"] if "patch" in patch else (base / patch["path"]).read_text()
        operations = yaml.safe_load(text)
        if not isinstance(operations, list):
            raise RenderError(f"{base}: only JSON 6902 patches (a list of operations) are supported")
        target = patch.get("target") or {}
        _check_selector(target, base, "patch target")
        matched = [r for r in resources if _matches(r, target)]
        if not matched:
            raise RenderError(f"{base}: patch target {target} matches nothing")
        for resource in matched:
            for op in operations:
                json_patch(resource.obj, op)


def _check_selector(selector: Obj, base: Path, what: str) -> None:
    unsupported = set(selector) - _SELECTOR_FIELDS
    if unsupported:
        raise RenderError(f"{base}: {what} fields {sorted(unsupported)} are not supported")


def _matches(resource: _Resource, target: Obj) -> bool:
    obj = resource.obj
    group, _, version = obj["apiVersion"].rpartition("/")
    checks = {
        "group": group,
        "version": version,
        "kind": obj["kind"],
        "namespace": obj["metadata"].get("namespace", ""),
    }
    for key, value in checks.items():
        if key in target and not re.fullmatch(target[key], value):
            return False
    if "annotationSelector" in target:
        # Only the equality form (key=value) is used here.
        key, _, value = target["annotationSelector"].partition("=")
        if obj["metadata"].get("annotations", {}).get(key) != value:
            return False
    if "name" in target:
        names = (obj["metadata"]["name"], resource.original_name)
        return any(re.fullmatch(target["name"], name) for name in names)
    return True


def _apply_replacement(resources: list[_Resource], replacement: Obj, base: Path) -> None:
    if set(replacement) != {"source", "targets"}:
        raise RenderError(f"{base}: a replacement needs source and targets, and nothing else here")
    source = dict(replacement["source"])
    field_path = source.pop("fieldPath", "metadata.name")
    _check_selector(source, base, "replacement source")
    sources = [r for r in resources if _matches(r, source)]
    if len(sources) != 1:
        # kustomize refuses an ambiguous source too ("multiple matches for selector").
        raise RenderError(f"{base}: replacement source {source} matches {len(sources)} objects, not 1")
    value = _get_field(sources[0].obj, field_path, base)
    for target in replacement["targets"]:
        if set(target) - {"select", "reject", "fieldPaths", "options"}:
            raise RenderError(f"{base}: replacement target fields {sorted(target)} are not supported")
        options = target.get("options") or {}
        if set(options) - {"create"}:
            raise RenderError(f"{base}: replacement options {sorted(options)} are not supported")
        _check_selector(target["select"], base, "replacement select")
        for reject in target.get("reject", []):
            _check_selector(reject, base, "replacement reject")
        for resource in resources:
            if not _matches(resource, target["select"]) or any(
                _matches(resource, reject) for reject in target.get("reject", [])
            ):
                continue
            for path in target["fieldPaths"]:
                _set_field(resource.obj, path, value, bool(options.get("create")), base)


def _field_parts(field_path: str) -> list[str]:
    # Dots separate fields except inside brackets: `data.[a.b]` is key `a.b`, `env.[name=X]` a list item.
    parts: list[str] = re.findall(r"\[[^\]]*\]|[^.\[\]]+", field_path)
    return parts


def _step(node: Any, part: str, create: bool) -> Any:
    if isinstance(node, list):
        if part.startswith("[") and "=" in part:
            key, _, wanted = part[1:-1].partition("=")
            return next((item for item in node if str(item.get(key)) == wanted), None)
        return node[int(part)] if part.isdigit() and int(part) < len(node) else None
    key = part[1:-1] if part.startswith("[") else part
    if key not in node and create:
        node[key] = {}
    return node.get(key)


def _get_field(obj: Obj, field_path: str, base: Path) -> Any:
    node: Any = obj
    for part in _field_parts(field_path):
        node = _step(node, part, create=False) if isinstance(node, dict | list) else None
        if node is None:
            raise RenderError(f"{base}: replacement source field {field_path} not found")
    return copy.deepcopy(node)


def _set_field(obj: Obj, field_path: str, value: Any, create: bool, base: Path) -> None:
    *parents, last = _field_parts(field_path)
    node: Any = obj
    for part in parents:
        node = _step(node, part, create) if isinstance(node, dict | list) else None
        if node is None:
            raise RenderError(f"{base}: replacement target field {field_path} not found")
    key = last[1:-1] if last.startswith("[") else last
    if not isinstance(node, dict) or (key not in node and not create):
        raise RenderError(f"{base}: replacement target field {field_path} not found")
    current = node.get(key)
    # kustomize copies a scalar's text and keeps the target's type, so "4" in a ConfigMap stays a string.
    if isinstance(current, str) and type(value) in (int, float):
        node[key] = str(value)
    elif type(current) in (int, float) and isinstance(value, str):
        node[key] = int(value) if isinstance(current, int) else float(value)
    else:
        node[key] = copy.deepcopy(value)


def json_patch(doc: Obj, op: Obj) -> None:
    """Apply one RFC 6902 operation (add, replace, remove, test) in place."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    kind = op["op"]
    if kind == "test":
        actual = node[int(last)] if isinstance(node, list) else node.get(last)
        if actual != op["value"]:
            raise RenderError(f"test {op['path']}: expected {op['value']!r}, found {actual!r}")
        return
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            node[index] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del node[index]
        else:
            raise RenderError(f"unsupported JSON patch op {kind!r}")
        return
    if kind in ("replace", "remove") and last not in node:
        raise RenderError(f"{kind} {op['path']}: no such field")
    if kind in ("add", "replace"):
        node[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del node[last]
    else:
        raise RenderError(f"unsupported JSON patch op {kind!r}")
