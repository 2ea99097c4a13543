"""How the local cluster adapts upstream Knative's objects (cluster/knative.py), where an adaptation
changes what the e2e tests measure."""

from __future__ import annotations

from cluster import knative


def _config_network(data: dict[str, str]) -> dict:
    obj = {"kind": "ConfigMap", "metadata": {"name": "config-network"}, "data": dict(data)}
    adapted = knative._adapt(obj, {})
    assert adapted is not None
    return adapted["data"]


def test_the_activator_never_falls_back_to_the_revisions_cluster_ip_on_a_cluster_without_a_mesh():
    # Upstream ships "auto" (or nothing, which means auto); under it a wake can flip a revision to
    # routing on the kubelet's Ready for good (stop 39's wake test: served 0.5-1 s after ready).
    assert _config_network({})["mesh-compatibility-mode"] == "disabled"
    assert _config_network({"mesh-compatibility-mode": "auto"})["mesh-compatibility-mode"] == "disabled"


def test_the_ingress_class_is_kourier_and_other_settings_are_kept():
    data = _config_network({"domain-template": "{{.Name}}.{{.Namespace}}"})
    assert data["ingress-class"] == knative.KOURIER_CLASS
    assert data["domain-template"] == "{{.Name}}.{{.Namespace}}"


def test_the_activator_restarts_when_the_mode_is_set_on_a_cluster_made_before():
    # It reads config-network once, at its start: a changed pod template makes the Deployment roll.
    upstream = {
        "kind": "Deployment",
        "metadata": {"name": "activator", "namespace": "knative-serving"},
        "spec": {"template": {"spec": {"containers": [{"name": "activator", "image": "ko://x"}]}}},
    }
    adapted = knative._adapt(upstream, {"ko://x": "dev.local/knative/activator:v"})
    assert adapted is not None
    annotations = adapted["spec"]["template"]["metadata"]["annotations"]
    assert annotations["tts-predictor/mesh-compatibility-mode"] == knative.MESH_COMPATIBILITY_MODE
