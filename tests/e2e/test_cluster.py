"""The cluster itself: a pod of a locally built image runs, gets an address from the CNI bridge, and
another pod reaches it through its Service by name (kube-proxy's rules and CoreDNS), all from images
imported into containerd with no registry."""

from __future__ import annotations

import json
import time

from cluster import images

NAMESPACE = "e2e-cluster"

SERVER = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "tiny", "namespace": NAMESPACE},
    "spec": {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "tiny"}},
        "template": {
            "metadata": {"labels": {"app": "tiny"}},
            "spec": {
                "containers": [
                    {
                        "name": "tiny",
                        "image": images.TINY,
                        "imagePullPolicy": "Never",
                        "args": ["serve", ":8080"],
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1},
                    }
                ]
            },
        },
    },
}
SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "tiny", "namespace": NAMESPACE},
    "spec": {"selector": {"app": "tiny"}, "ports": [{"port": 80, "targetPort": 8080}]},
}


def _client(url: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"client-{int(time.time())}", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "get", "image": images.TINY, "imagePullPolicy": "Never", "args": ["get", url]}
            ],
        },
    }


def test_a_pod_reaches_another_through_its_service_by_name(cluster):
    cluster.kubectl("create", "namespace", NAMESPACE)
    applied = cluster.kubectl(
        "apply", "-f", "-", input_text="\n".join(json.dumps(o) for o in (SERVER, SERVICE))
    )
    assert applied.returncode == 0, applied.stderr
    ready = cluster.kubectl(
        "-n", NAMESPACE, "rollout", "status", "deployment/tiny", "--timeout=120s", timeout=150
    )
    assert ready.returncode == 0, ready.stderr
    pod = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pods", "-l", "app=tiny", "-o", "json").stdout)[
        "items"
    ][0]
    assert pod["status"]["podIP"].startswith("10.214.0."), pod["status"]

    client = _client(f"http://tiny.{NAMESPACE}.svc.cluster.local/hello")
    created = cluster.kubectl("apply", "-f", "-", input_text=json.dumps(client))
    assert created.returncode == 0, created.stderr
    name = client["metadata"]["name"]
    done = cluster.kubectl(
        "-n", NAMESPACE, "wait", f"pod/{name}", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=120s",
        timeout=150,
    )  # fmt: skip
    logs = cluster.kubectl("-n", NAMESPACE, "logs", name).stdout
    # The log holds any retry (kube-proxy may lag the Service by a moment) before the answer.
    answer = logs.splitlines()[-1] if logs else ""

    assert done.returncode == 0, f"{done.stderr} {logs}"
    assert answer == f"200 tiny {pod['metadata']['name']} /hello"
