"""The image: cold start exec -> ready in the container against the same predictor bare, and sizes.

Rounds alternate bare and container, each from an empty MODEL_DIR (a fresh emptyDir: the voice is
downloaded from S3 each time), so a neighbour's load on this shared machine lands on both sides.
Bare is `python -m predictor serve` from this checkout's venv, timed from Popen; the container is
`podman run -d` of the built image with the knative cpu overlay's settings (tts_ops/podrun.py), timed
from the moment podman is exec'd, so creating the container counts against it. Both get the
manifest's env and the same CPU_THREADS.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import httpx

from bench.common import THREADS, Predictor, Row, Session, SuiteResult, log, median
from testing.ports import free_port
from testing.s3 import aws_env
from tts_ops import image as image_build
from tts_ops.podrun import manifest_pod, remove, run_args

RUNS = 3
TAG = "tts-predictor:bench"


def pull_equivalent_s(tag: str, scratch: Path) -> tuple[float, float]:
    """(save, load) seconds: ``podman save`` of ``tag`` to an archive, then ``podman load`` of it into
    an empty store of its own (--root), so that every layer is written as on a node that never had
    the image; the store is removed afterwards."""
    archive = scratch / "image.tar"
    store = ["podman", "--root", str(scratch / "root"), "--runroot", str(scratch / "run")]
    started = time.perf_counter()
    subprocess.run(["podman", "save", "-q", "-o", str(archive), tag], check=True, capture_output=True)
    saved = time.perf_counter()
    try:
        subprocess.run([*store, "load", "-q", "-i", str(archive)], check=True, capture_output=True)
        return saved - started, time.perf_counter() - saved
    finally:
        subprocess.run([*store, "rmi", "-a", "-f"], capture_output=True)
        archive.unlink(missing_ok=True)


def container_once(session: Session, spec, env: dict[str, str]) -> float:
    name = f"tts-bench-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**env, "HTTP_PORT": str(port), "GRPC_PORT": str(free_port())}
    started = time.perf_counter()
    try:
        subprocess.run(run_args(spec, TAG, name, env), check=True, capture_output=True)
        deadline = time.monotonic() + 180
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get("/v2/models/tts/ready").status_code == 200:
                        return time.perf_counter() - started
                except httpx.TransportError:
                    pass
                time.sleep(0.01)
        logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
        raise RuntimeError(f"container not ready after 180 s:\n{(logs.stdout + logs.stderr)[-3000:]}")
    finally:
        remove(name)


def bare_once(session: Session, env: dict[str, str]) -> float:
    p = Predictor(session, session.path("model"), **env)
    try:
        return p.wait_ready()
    finally:
        p.stop()


def run(session: Session) -> SuiteResult:
    res = SuiteResult()
    t = time.perf_counter()
    image_build.build(TAG, [])
    log(f"image {TAG} built (or found in the layer cache) in {time.perf_counter() - t:.0f} s")
    spec = manifest_pod()
    # The manifest's settings on both sides; the voice and the shadow bucket live in this session's S3.
    shadow_bucket = spec.env["SHADOW_SINK"].removeprefix("s3://").split("/")[0]
    import boto3

    boto3.client("s3", endpoint_url=session.moto).create_bucket(Bucket=shadow_bucket)
    env = {**spec.env, "VOICE_URI": session.voice, "CPU_THREADS": str(THREADS)}
    container_env = {**aws_env(session.moto), **env}
    container_env = {
        k: v for k, v in container_env.items() if not k.startswith("AWS_CONFIG") and "SHARED" not in k
    }

    # Untimed: page cache warm for the image's layers and the venv alike.
    bare_once(session, {**env, "MODEL_DIR": str(session.path("model"))})
    container_once(session, spec, container_env)
    bare, boxed = [], []
    for i in range(RUNS):
        bare.append(bare_once(session, {**env, "MODEL_DIR": str(session.path("model"))}))
        boxed.append(container_once(session, spec, container_env))
        log(f"round {i + 1}: bare {bare[-1]:.3f} s, container {boxed[-1]:.3f} s")
    b, c = median(bare), median(boxed)
    res.rows.append(
        Row("image", "cold start exec->ready, bare `tts-predictor serve`", b, "s", note=f"median of {RUNS}")
    )
    res.rows.append(
        Row(
            "image",
            "cold start exec->ready, container (podman run -d -> ready)",
            c,
            "s",
            "bare",
            b,
            c / b,
            goal="<= 1.1",
            met=c / b <= 1.1,
            note=f"median of {RUNS}, interleaved with bare",
        )
    )
    tool = image_build.engine()
    base = image_build.base_image()
    size, base_size = image_build.image_bytes(tool, TAG), image_build.image_bytes(tool, base)
    res.rows.append(
        Row("image", "image size", size / 1e6, "MB", "base " + base, base_size / 1e6, size / base_size)
    )
    if tool == "podman":
        saved_s, loaded_s = pull_equivalent_s(TAG, session.path("pull"))
        res.rows.append(
            Row(
                "image",
                "pull-equivalent: podman save + podman load into an empty store",
                saved_s + loaded_s,
                "s",
                note=f"save {saved_s:.1f} s, load {loaded_s:.1f} s: a registry pull's disk work, no network",
            )
        )
    layers = image_build.layer_sizes(tool, TAG)
    for nbytes, created in layers:
        if nbytes >= 1e6:
            res.notes.append(f"layer {nbytes / 1e6:8.1f} MB  {created.strip()[:100]}")
    res.details = {
        "bare_runs_s": bare,
        "container_runs_s": boxed,
        "image_bytes": size,
        "base_bytes": base_size,
        "layers": [{"bytes": n, "created_by": cb} for n, cb in layers],
    }
    return res
