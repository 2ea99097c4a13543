"""Offline checks of the cluster's pins (cluster/versions.toml), its generated wrapper go.mods and the
schema conversion: fast, no Go and no network (the cluster itself is tests/e2e, outside `make test`)."""

from __future__ import annotations

import re

import pytest

from cluster import pins, schemas


def _required(gomod: str) -> dict[str, str]:
    return dict(re.findall(r"^(?:\t|require )(\S+) (v\S+)(?: // indirect)?$", gomod, flags=re.M))


def test_every_component_is_pinned_with_a_module_a_version_and_a_reason():
    for comp in pins.components().values():
        assert comp.module and re.fullmatch(r"v\d+\.\d+\.\d+", comp.version), comp
        assert len(comp.reason) > 20, f"{comp.name}: say why this version"


def test_kubernetes_is_a_1_34_release_with_its_published_staging_modules():
    kube = pins.components()["kubernetes"]
    assert kube.version.startswith("v1.34.")
    assert kube.staging_version == "v0.34." + kube.version.split(".")[2]


@pytest.mark.parametrize("group", sorted(pins.groups()))
def test_each_wrapper_go_mod_requires_exactly_the_pinned_versions(group):
    # A pin edited without `python -m cluster.gomod` would build something else than versions.toml says.
    gomod = (pins.groups()[group].folder / "go.mod").read_text()
    required = _required(gomod)
    for comp in pins.groups()[group].members:
        assert required.get(comp.module) == comp.version, f"{comp.module}: regenerate {group}/go.mod"
    assert "=> ./" not in gomod and "=> ../" not in gomod, "a local replace cannot build from module zips"


def test_the_kubernetes_wrapper_replaces_every_staging_module_with_its_published_version():
    kube = pins.components()["kubernetes"]
    gomod = (pins.groups()["kubernetes"].folder / "go.mod").read_text()
    replaced = re.findall(r"^\t(k8s\.io/\S+) => (k8s\.io/\S+) (v\S+)$", gomod, flags=re.M)
    assert len(replaced) > 25
    assert all(old == new and version == kube.staging_version for old, new, version in replaced)


def test_conversion_closes_nested_objects_but_leaves_the_root_open_as_the_catalog_does():
    crd_schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"port": {"format": "int-or-string", "x-kubernetes-int-or-string": True}},
            },
            "status": {
                "type": "object",
                "additionalProperties": True,
                "properties": {"a": {"type": "string"}},
            },
        },
    }

    converted = schemas.convert(crd_schema)

    assert "additionalProperties" not in converted
    assert converted["properties"]["spec"]["additionalProperties"] is False
    assert converted["properties"]["spec"]["properties"]["port"] == {
        "oneOf": [{"type": "string"}, {"type": "integer"}]
    }
    assert converted["properties"]["status"]["additionalProperties"] is True
    assert "additionalProperties" not in crd_schema["properties"]["spec"], "the input is left as it was"


def test_every_kind_the_overlays_name_has_a_generated_schema():
    for group, kinds in schemas.KINDS.items():
        for kind in kinds:
            assert list((schemas.OUT / group).glob(f"{kind.lower()}_*.json")), f"{group} {kind}"
