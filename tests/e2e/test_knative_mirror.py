"""Shadow traffic on the cluster through a real Envoy (issue 22, `make e2e` test 6): our VirtualService's
route and mirror rule, as Istio's sidecar would program them (tts_ops.mirroring), run by an Envoy pod
in front of the knative flavour's stable predictor (through Kourier and the activator, as the rule's
destination, Knative's local gateway, would) and its always-on canary. Istio's control plane cannot run
here; this is the data plane it would program.

The canary receives the shipped share of requests (within binomial error); both sides write shadow
records for the same request ids, and `tts-ops compare` on them passes for the same image and fails
for a canary deployed with a deliberately wrong setting (DEFAULT_LENGTH_SCALE=1.3: slower speech)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from testing import binomial
from testing.bodies import v2_request
from testing.kube import NAMESPACE, eventually, one_container_deployment, port_forward, ready
from testing.predictor import metric_in, run_cli
from tts_ops import compare, kustomize, mirroring

MIRROR = "tts-mirror"
CANARY_DEPLOYMENT = "tts-canary-predictor"
INFER = "/v2/models/{model_name}/infer"
N = 120
TEXTS = ["The canary should sound like stable.", "Shadow traffic never reaches a user.", "Short one."]
# Two 1-CPU predictors on a 2-CPU node beside Knative and the load: latencies differ by chance far
# more than in a real cluster (tests/system/test_shadow.py loosens them the same way).
LOOSE_LATENCY = ("--max-p50-increase", "1.0", "--max-p99-increase", "3.0")


def _virtual_service() -> dict[str, Any]:
    overlay = Path(__file__).resolve().parents[2] / "knative" / "overlays" / "e2e"
    (found,) = [o for o in kustomize.render(overlay) if o["kind"] == "VirtualService"]
    return found


def _objects() -> list[dict[str, Any]]:
    from cluster.knative import envoy_image

    service = _virtual_service()
    (mirror,) = mirroring.mirrors(service)
    upstreams = {
        # Knative's cluster-local gateway is Kourier's internal listener here (no Istio).
        mirroring.route_destination(service).host: "kourier-internal.kourier-system.svc.cluster.local:80",
        mirror.destination.host: f"{mirror.destination.host}:{mirror.destination.port}",
    }
    config = mirroring.bootstrap(service, upstreams, 8080, 9901, address="0.0.0.0")
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": MIRROR, "namespace": NAMESPACE},
            "data": {"envoy.json": json.dumps(config, indent=1)},
        },
        one_container_deployment(
            MIRROR,
            {
                "name": "envoy",
                "image": envoy_image(),
                "imagePullPolicy": "Never",
                "args": ["-c", "/etc/envoy/envoy.json", "--concurrency", "1", "--log-level", "warn"],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/envoy"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            },
            volumes=[{"name": "config", "configMap": {"name": MIRROR}}, {"name": "tmp", "emptyDir": {}}],
        ),
    ]


def _canary_pod(cluster) -> str:
    pods = [
        p
        for p in cluster.pods(NAMESPACE, "serving.kserve.io/inferenceservice=tts-canary")
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]["metadata"]["name"]


def _answered(cluster) -> float:
    return metric_in(
        cluster.pod_metrics(NAMESPACE, _canary_pod(cluster)), "tts_requests_total", route=INFER, code="200"
    )


def _settled(cluster, timeout: float = 60) -> float:
    """The canary's count of answered inferences once it stops moving (mirrors are fire-and-forget:
    the last copies may still run when stable has answered)."""
    deadline = time.monotonic() + timeout
    last = _answered(cluster)
    while time.monotonic() < deadline:
        time.sleep(3)
        now = _answered(cluster)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the canary's count still moving after {timeout} s")


@pytest.fixture(scope="module")
def mirror(cluster, knative):
    text = "\n".join(json.dumps(o) for o in _objects())
    assert cluster.kubectl("apply", "-f", "-", input_text=text).returncode == 0
    assert (
        cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", f"deployment/{MIRROR}", "--timeout=120s"
        ).returncode
        == 0
    )
    (pod,) = cluster.pods(NAMESPACE, f"app={MIRROR}")
    with port_forward(cluster, NAMESPACE, pod["metadata"]["name"], 8080) as url:
        yield url
    cluster.kubectl("delete", "-f", "-", input_text=text)


def _send(url: str, batch: str) -> list[str]:
    """N requests through the mirror, each with its own id; every answer 200 from stable."""
    ids = [f"{batch}-{i}" for i in range(N)]
    with httpx.Client(timeout=180) as client:
        for i, request_id in enumerate(ids):
            r = client.post(
                url + "/v2/models/tts/infer",
                json=v2_request(TEXTS[i % len(TEXTS)]),
                headers={"X-Request-Id": request_id},
            )
            assert r.status_code == 200, r.text[:300]
            assert r.headers["x-request-id"] == request_id
    return ids


def _records(uri: str, batch: str, tmp: Path) -> Path:
    """The records under `uri` of this batch's requests, as one JSONL file for compare."""
    from cluster.deploy import S3_HOST_PORT
    from testing.s3 import aws_env

    os.environ.update(aws_env(f"http://127.0.0.1:{S3_HOST_PORT}"))
    kept = [r for r in compare.load_records(uri) if r["id"].startswith(batch + "-")]
    path = tmp / f"{uri.rsplit('/', 1)[-1]}-{batch}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return path


def _compare(stable: Path, canary: Path, share: float) -> Any:
    from cluster.deploy import S3_HOST_PORT
    from testing.s3 import aws_env

    # Only the mirrored share of stable's requests can match: the floor is the share's binomial low.
    low, _ = binomial.count_range(N, share)
    args = ["--min-match-rate", f"{max(low - 1, 1) / N:.3f}", *LOOSE_LATENCY, "--json"]
    return run_cli(
        "compare", "--stable", str(stable), "--canary", str(canary), *args,
        env=aws_env(f"http://127.0.0.1:{S3_HOST_PORT}"), module="tts_ops",
    )  # fmt: skip


def _wait_records(uri: str, batch: str, count: int, tmp: Path) -> Path:
    # Records are written in batches every SHADOW_FLUSH_S (10 s).
    def enough() -> Path | None:
        path = _records(uri, batch, tmp)
        return path if len(path.read_text().splitlines()) >= count else None

    return eventually(f"{count} records of {batch} under {uri}", enough, 60, 2)


def test_envoy_mirrors_the_shipped_share_and_an_identical_canary_passes_compare(
    cluster, mirror, e2e_report, tmp_path
):
    share = mirroring.mirrors(_virtual_service())[0].percent / 100
    before = _answered(cluster)
    batch = f"mirror-{uuid.uuid4().hex[:6]}"
    started = time.time()
    ids = _send(mirror, batch)
    copies = _settled(cluster) - before

    low, high = binomial.count_range(N, share)
    assert low <= copies <= high, (copies, (low, high), share)
    stable = _wait_records("s3://tts-shadow/stable", batch, N, tmp_path)
    canary = _wait_records("s3://tts-shadow/canary", batch, int(copies), tmp_path)
    canary_ids = {json.loads(line)["id"] for line in canary.read_text().splitlines()}
    assert canary_ids <= set(ids) and len(canary_ids) == copies, "the canary's records are stable's requests"

    run = _compare(stable, canary, share)
    assert run.returncode == 0, run.stdout + run.stderr
    e2e_report["knative mirror"] = {
        "requests": N,
        "share": share,
        "mirrored": copies,
        "binomial_range": [low, high],
        "seconds": time.time() - started,
        "compare_same_image": json.loads(run.stdout).get("verdict", "PASS"),
    }


def test_a_canary_with_a_wrong_setting_fails_compare_naming_duration(cluster, mirror, e2e_report, tmp_path):
    share = mirroring.mirrors(_virtual_service())[0].percent / 100
    env = cluster.get("-n", NAMESPACE, "inferenceservice", "tts-canary")["spec"]["predictor"]["containers"][
        0
    ]["env"]
    sink = next(i for i, e in enumerate(env) if e["name"] == "SHADOW_SINK")
    shipped_sink = env[sink]["value"]
    path = "/spec/predictor/containers/0/env"
    patch = [
        {"op": "add", "path": f"{path}/-", "value": {"name": "DEFAULT_LENGTH_SCALE", "value": "1.3"}},
        # Its records apart from the identical canary's of the test before.
        {"op": "replace", "path": f"{path}/{sink}/value", "value": "s3://tts-shadow/canary-slower"},
    ]
    out = cluster.kubectl(
        "-n", NAMESPACE, "patch", "inferenceservice", "tts-canary", "--type=json", "-p", json.dumps(patch)
    )
    assert out.returncode == 0, out.stderr
    try:

        def rolled_out() -> bool:
            pods = [
                p
                for p in cluster.pods(NAMESPACE, "serving.kserve.io/inferenceservice=tts-canary")
                if not p["metadata"].get("deletionTimestamp")
            ]
            return len(pods) == 1 and "DEFAULT_LENGTH_SCALE" in json.dumps(pods[0]["spec"]) and ready(pods[0])

        eventually("the canary rolled out with the wrong setting, alone", rolled_out, 240, 2)
        before = _answered(cluster)
        batch = f"slower-{uuid.uuid4().hex[:6]}"
        _send(mirror, batch)
        copies = _settled(cluster) - before
        stable = _wait_records("s3://tts-shadow/stable", batch, N, tmp_path)
        canary = _wait_records("s3://tts-shadow/canary-slower", batch, int(copies), tmp_path)

        run = _compare(stable, canary, share)
        summary = json.loads(run.stdout)
        assert run.returncode == 1, run.stdout + run.stderr
        assert any(r.startswith("duration ratio") for r in summary["reasons"]), summary["reasons"]
        e2e_report["knative mirror"]["compare_wrong_setting"] = {
            "mirrored": copies,
            "reasons": summary["reasons"],
        }
    finally:
        # Back as shipped: the added variable removed (it is the last), the sink restored.
        restore = [
            {"op": "remove", "path": f"{path}/{len(env)}"},
            {"op": "replace", "path": f"{path}/{sink}/value", "value": shipped_sink},
        ]
        cluster.kubectl(
            "-n",
            NAMESPACE,
            "patch",
            "inferenceservice",
            "tts-canary",
            "--type=json",
            "-p",
            json.dumps(restore),
        )
