"""Test 2 of `make e2e`: the keda flavour applied for real (its e2e overlay, by `make cluster-deploy`),
KServe (Standard mode) creates the predictor's Deployment, and KEDA's operator takes its replicas over
through the HorizontalPodAutoscaler it creates for the ScaledObject."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing.kube import eventually
from tts_ops.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = "keda/overlays/e2e"


@pytest.fixture(scope="module")
def deployed(keda):
    # The e2e overlay is keda/overlays/cpu with only what this cluster needs changed (its
    # kustomization says what and why; among them the kafka trigger, found missing by this test).
    return render(ROOT / OVERLAY)


def test_kserve_creates_the_deployment_and_keda_owns_its_replicas(cluster, deployed):
    namespace = next(o["metadata"]["name"] for o in deployed if o["kind"] == "Namespace")
    scaled = next(o for o in deployed if o["kind"] == "ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]["name"]

    deployment = eventually(
        f"Deployment {target}", lambda: cluster.get("-n", namespace, "deployment", target), 180
    )
    hpa_name = f"keda-hpa-{scaled['metadata']['name']}"
    hpa = eventually(f"HPA {hpa_name}", lambda: cluster.get("-n", namespace, "hpa", hpa_name), 180)

    owners = {(o["kind"], o["name"]) for o in deployment["metadata"].get("ownerReferences", [])}
    assert ("InferenceService", "tts") in owners, owners
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": target}
    assert hpa["spec"]["maxReplicas"] == scaled["spec"]["maxReplicaCount"]
    assert {(o["kind"], o["name"]) for o in hpa["metadata"]["ownerReferences"]} == {
        ("ScaledObject", scaled["metadata"]["name"])
    }
    status = eventually(
        "the ScaledObject's status",
        lambda: (cluster.get("-n", namespace, "scaledobject", scaled["metadata"]["name"]) or {}).get(
            "status"
        ),
        180,
    )
    assert status["scaleTargetKind"] == "apps/v1.Deployment", status
