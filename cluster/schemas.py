"""Generate the JSON schemas tts_ops/manifests.py validates CRD kinds against (cluster/schemas/), from
the pinned CRDs (cluster.crds), converted the way the datree CRDs-catalog converts them, so the
validator's strictness rules (tts_ops/manifests.py strict_schema) apply unchanged:

* every nested node of type object with `properties` and no `additionalProperties` gets
  `additionalProperties: false` (the root is left open; strict_schema closes it);
* a node with `format: int-or-string` becomes `oneOf: [string, integer]`;
* files are `<group>/<kind>_<version>.json`, lower case, one per served version.

The catalog's known false rejection (additionalProperties: false also on nodes marked
x-kubernetes-preserve-unknown-fields) is kept here and undone by strict_schema, so both sources read
the same. Run: make schemas (python -m cluster.schemas [--check])."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from cluster import crds

OUT = Path(__file__).resolve().parent / "schemas"

# The kinds our overlays name (plus the serving runtimes an InferenceService refers to).
KINDS = {
    "serving.kserve.io": {"InferenceService", "ServingRuntime", "ClusterServingRuntime"},
    "keda.sh": {"ScaledObject", "TriggerAuthentication", "ClusterTriggerAuthentication"},
    "http.keda.sh": {"HTTPScaledObject", "InterceptorRoute"},
    "serving.knative.dev": {"Service"},
    "eventing.knative.dev": {"Broker", "Trigger"},
    "networking.istio.io": {"VirtualService", "DestinationRule"},
    "monitoring.coreos.com": {"PodMonitor", "ServiceMonitor", "PrometheusRule"},
}


def close_objects(node: Any, root: bool = True) -> Any:
    if isinstance(node, dict):
        is_object = node.get("type") == "object" or (
            isinstance(node.get("type"), list) and "object" in node["type"]
        )
        if not root and is_object and "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            close_objects(value, root=False)
    elif isinstance(node, list):
        for value in node:
            close_objects(value, root=False)
    return node


def int_or_string(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: {"oneOf": [{"type": "string"}, {"type": "integer"}]}
            if isinstance(value, dict) and value.get("format") == "int-or-string"
            else int_or_string(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [int_or_string(value) for value in node]
    return node


def convert(schema: dict[str, Any]) -> dict[str, Any]:
    return int_or_string(close_objects(json.loads(json.dumps(schema))))


def generate() -> dict[str, str]:
    """File name relative to OUT -> JSON text, with a provenance index."""
    files: dict[str, str] = {}
    sources: list[str] = []
    for comp, file, crd in crds.crds():
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        if kind not in KINDS.get(group, ()):
            continue
        for version in crd["spec"]["versions"]:
            schema = version.get("schema", {}).get("openAPIV3Schema")
            if not schema or not version.get("served", True):
                continue
            name = f"{group}/{kind.lower()}_{version['name']}.json"
            files[name] = json.dumps(convert(schema), indent=1, sort_keys=True) + "\n"
            relative = file.relative_to(crds.module_dir(comp.module, comp.version))
            sources.append(f"| {name} | {comp.module}@{comp.version} `{relative}` |")
    missing = {f"{g} {k}" for g, kinds in KINDS.items() for k in kinds} - {
        f"{n.split('/')[0]} {k}" for n in files for k in _kinds_of(n)
    }
    if missing:
        raise SystemExit(f"no pinned CRD defines: {', '.join(sorted(missing))}")
    files["README.md"] = (
        "# CRD JSON schemas (generated: `make schemas`; do not edit)\n\n"
        "From the CRDs of the modules pinned in `cluster/versions.toml`, converted as the datree\n"
        "CRDs-catalog converts them (see `cluster/schemas.py`); `tts_ops/manifests.py` validates against them.\n\n"
        "| file | from |\n| --- | --- |\n" + "\n".join(sorted(sources)) + "\n"
    )
    return files


def _kinds_of(name: str) -> set[str]:
    group, file = name.split("/", 1)
    stem = file.rsplit("_", 1)[0]
    return {k for k in KINDS.get(group, ()) if k.lower() == stem}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.schemas")
    parser.add_argument(
        "--check", action="store_true", help="fail if cluster/schemas differs from a fresh run"
    )
    args = parser.parse_args(argv)
    files = generate()
    if args.check:
        have = {str(p.relative_to(OUT)): p.read_text() for p in OUT.rglob("*") if p.is_file()}
        if have != files:
            diff = sorted(set(have) ^ set(files)) or sorted(k for k in files if have.get(k) != files[k])
            print(f"cluster/schemas is stale: {', '.join(diff)} (run make schemas)", file=sys.stderr)
            return 1
        print(f"cluster/schemas: {len(files) - 1} schemas up to date")
        return 0
    tmp = OUT.with_name("schemas.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    shutil.rmtree(OUT, ignore_errors=True)
    tmp.rename(OUT)
    print(f"{OUT}: {len(files) - 1} schemas")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
