"""The fallback kustomize renderer (tts_ops.kustomize) against kubectl on small trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tts_ops import kustomize


def _write(folder: Path, files: dict[str, object]) -> Path:
    for name, content in files.items():
        file = folder / name
        file.parent.mkdir(parents=True, exist_ok=True)
        docs = content if isinstance(content, list) else [content]
        file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return folder


def _obj(kind: str, name: str, **fields: object) -> dict:
    return {"apiVersion": "example.com/v1", "kind": kind, "metadata": {"name": name}, **fields}


def _key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _kustomization(**fields: object) -> dict:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **fields}


@pytest.fixture(autouse=True)
def _kubectl() -> None:
    assert shutil.which("kubectl"), "kubectl is needed to check the fallback renderer against kustomize"


def test_replacement_keeps_the_target_type_and_creates_missing_fields_as_kubectl_does(tmp_path):
    tree = _write(
        tmp_path,
        {
            "objects.yaml": [
                _obj("Bound", "source", spec={"max": 7}),
                _obj("Scaler", "scaler", spec={"min": 0}),
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "topic"},
                    "data": {"a.b": "0"},
                },
            ],
            "kustomization.yaml": _kustomization(
                resources=["objects.yaml"],
                replacements=[
                    {
                        "source": {"kind": "Bound", "name": "source", "fieldPath": "spec.max"},
                        "targets": [
                            {
                                "select": {"kind": "Scaler"},
                                "fieldPaths": ["spec.max", "spec.limits.max"],
                                "options": {"create": True},
                            },
                            {"select": {"kind": "ConfigMap", "name": "topic"}, "fieldPaths": ["data.[a.b]"]},
                        ],
                    }
                ],
            ),
        },
    )

    fallback = kustomize.render_kustomization(tree)

    assert sorted(fallback, key=_key) == sorted(kustomize.render_with_kubectl(tree), key=_key)
    scaler = next(o for o in fallback if o["kind"] == "Scaler")
    assert scaler["spec"] == {"min": 0, "max": 7, "limits": {"max": 7}}
    assert next(o for o in fallback if o["kind"] == "ConfigMap")["data"] == {"a.b": "7"}


def test_replacement_source_matching_a_suffixed_copy_by_its_old_name_is_refused_by_both(tmp_path):
    # Why keda/predictor, not keda/base, holds the replica-bound replacement: the canary is the
    # predictor with a nameSuffix, and kustomize still matches it by its original name.
    _write(tmp_path / "base", {"o.yaml": _obj("Bound", "x", spec={"max": 4})})
    _write(tmp_path / "base", {"kustomization.yaml": _kustomization(resources=["o.yaml"])})
    _write(
        tmp_path / "copy", {"kustomization.yaml": _kustomization(resources=["../base"], nameSuffix="-copy")}
    )
    tree = _write(
        tmp_path / "top",
        {
            "s.yaml": _obj("Scaler", "s", spec={"max": 0}),
            "kustomization.yaml": _kustomization(
                resources=["../base", "../copy", "s.yaml"],
                replacements=[
                    {
                        "source": {"kind": "Bound", "name": "x", "fieldPath": "spec.max"},
                        "targets": [{"select": {"kind": "Scaler"}, "fieldPaths": ["spec.max"]}],
                    }
                ],
            ),
        },
    )

    with pytest.raises(kustomize.RenderError, match="multiple matches"):
        kustomize.render_with_kubectl(tree)
    with pytest.raises(kustomize.RenderError, match="matches 2 objects, not 1"):
        kustomize.render_kustomization(tree)


def test_a_kustomization_field_the_renderer_lacks_is_refused_by_name(tmp_path):
    tree = _write(
        tmp_path,
        {
            "o.yaml": _obj("Bound", "x"),
            "kustomization.yaml": _kustomization(resources=["o.yaml"], commonLabels={"app": "tts"}),
        },
    )

    with pytest.raises(kustomize.RenderError, match=r"\['commonLabels'\] are not supported"):
        kustomize.render_kustomization(tree)
