"""Test 1 of `make e2e`: every overlay goes to the real API server (dry run, real CRDs, the KServe and
KEDA webhooks running), and a mutation per webhook is refused by that webhook. Our offline validator
(tts_ops/manifests.py) must agree with the server on each."""

from __future__ import annotations

import copy
import json

import pytest

from tts_ops import manifests

WEBHOOK_MUTATIONS = [
    # (overlay, kind, name, mutate, the webhook that must refuse it, what it says)
    (
        "keda/overlays/cpu",
        "InferenceService",
        "tts",
        lambda o: o["metadata"]["annotations"].update({"serving.kserve.io/autoscalerClass": "no-such-class"}),
        "inferenceservice.kserve-webhook-server.validator",
        "[no-such-class] is not a supported autoscaler class type",
    ),
    (
        "keda/overlays/cpu",
        "ScaledObject",
        "tts-predictor",
        # Not inverted replica bounds: KEDA's webhook only logs those (its operator refuses them later).
        lambda o: o["spec"]["triggers"][1].update({"name": o["spec"]["triggers"][0]["name"]}),
        "vscaledobject.kb.io",
        "is defined multiple times in the ScaledObject/ScaledJob, but it must be unique",
    ),
]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return manifests.render_all()


def _dry_namespace(overlay: str) -> str:
    return "dry-" + overlay.replace("/overlays/", "-")  # keda/overlays/cpu -> dry-keda-cpu


def _relocated(objects: list[dict], overlay: str) -> list[dict]:
    """The overlay's objects in a namespace of their own. `make cluster-deploy` runs the keda flavour
    in tts for real, so a dry run there would be an update of live objects, and KServe refuses an
    InferenceService whose deploymentMode changes ("cannot be changed from 'Standard' to 'Knative'")."""
    moved = copy.deepcopy(objects)
    for o in moved:
        if o["kind"] == "Namespace":
            o["metadata"]["name"] = _dry_namespace(overlay)
        elif "namespace" in o["metadata"]:
            o["metadata"]["namespace"] = _dry_namespace(overlay)
    return moved


@pytest.fixture(scope="module")
def namespaces(cluster) -> set[str]:
    # A dry run does not create a Namespace, so the objects in it would be refused: create them for real.
    names = {_dry_namespace(overlay) for overlay in manifests.OVERLAYS}
    for name in sorted(names):
        out = cluster.kubectl("create", "namespace", name)
        assert out.returncode == 0 or "AlreadyExists" in out.stderr, out.stderr
    return names


def _dry_run(cluster, objects: list[dict]) -> tuple[int, str]:
    out = cluster.kubectl(
        "apply", "--dry-run=server", "--server-side", "--force-conflicts", "--field-manager=e2e", "-f", "-",
        input_text="\n".join(json.dumps(o) for o in objects),
    )  # fmt: skip
    return out.returncode, out.stderr + out.stdout


@pytest.mark.parametrize("overlay", manifests.OVERLAYS)
def test_every_object_of_every_overlay_is_accepted_by_the_api_server(cluster, rendered, namespaces, overlay):
    objects = rendered[overlay]

    code, said = _dry_run(cluster, _relocated(objects, overlay))

    assert code == 0, said
    assert said.count("(server dry run)") == len(objects), said
    assert list(manifests.problems_of(objects)) == [], "the offline validator refuses what the server accepts"


def test_both_webhooks_are_registered_and_called_over_tls(cluster):
    validating = json.loads(cluster.kubectl("get", "validatingwebhookconfigurations", "-o", "json").stdout)
    urls = {h["name"]: h["clientConfig"].get("url", "") for c in validating["items"] for h in c["webhooks"]}

    assert urls["inferenceservice.kserve-webhook-server.validator"].startswith("https://")
    assert urls["vscaledobject.kb.io"].startswith("https://")


@pytest.mark.parametrize(("overlay", "kind", "name", "mutate", "webhook", "message"), WEBHOOK_MUTATIONS)
def test_each_webhook_refuses_an_object_broken_on_purpose(
    cluster, rendered, namespaces, overlay, kind, name, mutate, webhook, message
):
    objects = copy.deepcopy(rendered[overlay])
    target = next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)
    mutate(target)

    code, said = _dry_run(cluster, _relocated([target], overlay))

    assert code != 0, f"the server accepted the broken {kind}: {said}"
    assert f'admission webhook "{webhook}" denied the request' in said, said
    assert message in said, said
    offline = list(manifests.problems_of(objects))
    assert offline, f"the offline validator accepts the {kind} the {webhook} webhook refuses"
