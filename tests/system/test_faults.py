"""Faults with real processes: the local S3 behind testing/faults.py's proxy, which resets, stalls,
throttles or refuses connections while real predictors fetch, write event outputs and shadow records.

What each test holds the predictor to: nothing corrupt (no partial file at a final name, no partial
object at an output key), nothing downloaded twice that was already on disk, a clear reason (log line
and metric) while it cannot serve, and recovery once storage answers again, without a restart.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from predictor.artifact.download import journal_path, partial_path
from predictor.artifact.fetch import fetch
from predictor.artifact.manifest import MANIFEST, Manifest
from predictor.errors import IntegrityError, TransientStorageError
from testing.bodies import cloudevent_headers, speech_request, v2_request
from testing.faults import FaultProxy, Faults
from testing.polling import wait_until
from testing.predictor import PredictorProcess
from testing.s3 import aws_env, s3_client

MiB = 1024 * 1024
WEIGHTS = "model.safetensors"  # the torch engine's (the default's) big file


@pytest.fixture
def proxy(s3_server: str) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's moto S3, faultless until a test says otherwise."""
    with FaultProxy("127.0.0.1", urlsplit(s3_server).port or 80) as p:
        yield p


@pytest.fixture(scope="module")
def torch_bytes(voice_dir: Path) -> int:
    """Bytes a torch predictor fetches: every file of the voice the torch engine reads."""
    manifest = Manifest.loads((voice_dir / MANIFEST).read_bytes(), source=str(voice_dir))
    return sum(f.size for f in manifest.files_for("torch"))


def _weights_sha256(voice_dir: Path) -> str:
    manifest = Manifest.loads((voice_dir / MANIFEST).read_bytes(), source=str(voice_dir))
    return next(f.sha256 for f in manifest.files if f.path == WEIGHTS)


def _kill_container(pid: int) -> None:
    """SIGKILL a process and its children at once, as the kubelet ends a container (the forked fetch too)."""
    parent = psutil.Process(pid)
    for proc in [*parent.children(recursive=True), parent]:
        proc.send_signal(signal.SIGKILL)


def _refuse_after(proxy: FaultProxy, downstream: int) -> None:
    """Once ``downstream`` bytes went through: S3 goes away (open connections reset, new ones refused)."""
    wait_until(lambda: proxy.downstream_bytes > downstream, 120, interval=0.01, what=f"{downstream} bytes")
    proxy.set(Faults(refuse=True))
    proxy.reset_all()


# --- cold-start fetch ----------------------------------------------------------------------------


def test_cold_start_fetch_resumes_through_resets_and_a_stall_without_downloading_twice(
    start_predictor, proxy: FaultProxy, torch_bytes: int
):
    # The first four connections die 3 MiB in; a part resumes from its last byte, not its start.
    proxy.set(Faults(reset_after=3 * MiB, resets=4, bytes_per_s=24 * MiB))
    predictor = start_predictor(
        wait=False,
        AWS_ENDPOINT_URL=proxy.endpoint,
        FETCH_CONCURRENCY="4",
        FETCH_BACKOFF_S="0.05",
        S3_READ_TIMEOUT_S="1",
    )
    predictor.wait_for(lambda: proxy.downstream_bytes > 24 * MiB, 120, "a third of the weights")
    # Then every connection hangs for three read timeouts: the parts time out, retry and resume.
    proxy.set(stall_after=0)
    time.sleep(3)
    proxy.clear()

    predictor.wait_ready()

    logs = predictor.logs()
    assert "connection was closed" in logs.lower() or "reset" in logs.lower(), predictor.log_tail()
    assert "timeout" in logs.lower(), predictor.log_tail()
    # Every byte counted once on disk; on the wire, what was in flight when a connection died on top.
    assert predictor.metric("tts_fetch_bytes_total") == torch_bytes
    assert proxy.downstream_bytes < 1.25 * torch_bytes, (proxy.downstream_bytes, torch_bytes)
    assert predictor.metric("tts_cold_start_failures_total", reason="unreachable") == 0


def test_fetch_beyond_its_retries_stays_not_ready_says_why_and_recovers_when_s3_returns(
    start_predictor, proxy: FaultProxy, torch_bytes: int
):
    proxy.set(Faults(bytes_per_s=8 * MiB))
    predictor = start_predictor(
        wait=False,
        AWS_ENDPOINT_URL=proxy.endpoint,
        FETCH_CONCURRENCY="2",
        FETCH_PART_SIZE_MIB="1",
        FETCH_RETRIES="1",
        FETCH_BACKOFF_S="0.05",
        FETCH_RECOVERY_S="1",
    )
    # S3 goes away mid-download: connections reset, new ones refused.
    _refuse_after(proxy, 16 * MiB)
    predictor.wait_for(
        lambda: predictor.metric("tts_cold_start_failures_total", reason="unreachable") >= 2,
        120,
        "two failed whole fetches",
    )

    assert predictor.get("/v2/models/tts/ready").status_code == 503
    assert predictor.get("/v2/health/live").status_code == 200
    assert "the model stays not ready" in predictor.logs()
    model_dir = Path(predictor.env["MODEL_DIR"])
    assert not (model_dir / WEIGHTS).exists()  # nothing half-written at a final name
    assert not (model_dir / MANIFEST).exists()
    assert json.loads(journal_path(model_dir / WEIGHTS).read_text())["done"]  # kept for the resume

    proxy.clear()
    predictor.wait_ready(timeout=120)

    assert "the artifact fetch recovered" in predictor.logs()
    # Parts on disk before S3 went away were not fetched again; only those in flight were.
    assert proxy.downstream_bytes < torch_bytes + 8 * MiB, (proxy.downstream_bytes, torch_bytes)


def test_sigkill_mid_fetch_then_restart_resumes_and_verifies(
    start_predictor, proxy: FaultProxy, torch_bytes: int, voice_dir: Path, tmp_path: Path
):
    model_dir = tmp_path / "model"
    env = {
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "MODEL_DIR": str(model_dir),
        "FETCH_CONCURRENCY": "2",
        "FETCH_PART_SIZE_MIB": "2",
    }
    proxy.set(Faults(bytes_per_s=8 * MiB))
    first = start_predictor(wait=False, **env)
    first.wait_for(lambda: proxy.downstream_bytes > 24 * MiB, 120, "24 MiB of the weights")
    _kill_container(first.proc.pid)
    first.proc.wait(10)
    before = proxy.downstream_bytes
    journaled = len(json.loads(journal_path(model_dir / WEIGHTS).read_text())["done"]) * 2 * MiB
    assert journaled >= 16 * MiB
    assert not (model_dir / WEIGHTS).exists()

    proxy.clear()
    second = start_predictor(wait=False, **env)
    second.wait_ready()

    assert "resuming model.safetensors" in second.logs(), second.log_tail()
    assert proxy.downstream_bytes - before <= torch_bytes - journaled + 1 * MiB
    assert hashlib.sha256((model_dir / WEIGHTS).read_bytes()).hexdigest() == _weights_sha256(voice_dir)
    assert not partial_path(model_dir / WEIGHTS).exists()
    assert not journal_path(model_dir / WEIGHTS).exists()


def test_a_corrupt_resumed_part_is_caught_and_the_file_fetched_again(
    published_voice: str, proxy: FaultProxy, voice_dir: Path, tmp_path: Path, s3_env: str
):
    options = {"part_size": 1 * MiB, "concurrency": 2, "retries": 0, "engine": "torch"}
    proxy.set(Faults(bytes_per_s=16 * MiB))
    with ThreadPoolExecutor(1) as pool:
        pool.submit(_refuse_after, proxy, 20 * MiB)
        with pytest.raises(TransientStorageError):
            fetch(published_voice, tmp_path, endpoint_url=proxy.endpoint, **options)
    done = json.loads(journal_path(tmp_path / WEIGHTS).read_text())["done"]
    assert done
    # A byte of a journaled part flips on disk while nobody runs.
    with open(partial_path(tmp_path / WEIGHTS), "r+b") as f:
        f.seek(done[0] + 100)
        byte = f.read(1)
        f.seek(done[0] + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    proxy.clear()

    with pytest.raises(IntegrityError, match="sha256"):
        fetch(published_voice, tmp_path, endpoint_url=proxy.endpoint, **options)
    assert not (tmp_path / WEIGHTS).exists()
    assert not partial_path(tmp_path / WEIGHTS).exists()  # started over, not resumed from bad bytes

    fetch(published_voice, tmp_path, endpoint_url=proxy.endpoint, **options)
    assert hashlib.sha256((tmp_path / WEIGHTS).read_bytes()).hexdigest() == _weights_sha256(voice_dir)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs: too small for the 63 MB voice."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_model_dir_full_stays_not_ready_with_a_clear_reason_and_nothing_corrupt(
    start_predictor, small_tmpfs: Path, voice_dir: Path
):
    predictor = start_predictor(wait=False, MODEL_DIR=str(small_tmpfs), FETCH_RECOVERY_S="1")
    predictor.wait_for(
        lambda: predictor.metric("tts_cold_start_failures_total", reason="model_dir") >= 1,
        120,
        "a failed fetch counted as model_dir",
    )

    assert predictor.get("/v2/models/tts/ready").status_code == 503
    logs = predictor.logs()
    assert "No space left on device" in logs, predictor.log_tail()
    assert "the artifact needs" in logs and str(small_tmpfs) in logs
    names = {p.name for p in small_tmpfs.iterdir()}
    assert WEIGHTS not in names and MANIFEST not in names
    assert not partial_path(small_tmpfs / WEIGHTS).exists()  # its reserved space given back
    # Whatever did land at a final name is whole: the small files that fitted before the weights.
    manifest = Manifest.loads((voice_dir / MANIFEST).read_bytes(), source=str(voice_dir))
    for f in manifest.files:
        if (small_tmpfs / f.path).exists():
            assert hashlib.sha256((small_tmpfs / f.path).read_bytes()).hexdigest() == f.sha256


# --- event outputs and shadow sinks --------------------------------------------------------------

OUTPUTS = "fault-outputs"
SENTENCE = "An event written while storage misbehaves."


def _event(predictor, event_id: str, data: dict, timeout: float = 120):
    return predictor.post(
        "/v1/models/tts:predict",
        headers=cloudevent_headers(event_id, source="/tests/faults"),
        content=json.dumps(data),
        timeout=timeout,
    )


def _objects(s3, prefix: str) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=OUTPUTS, Prefix=prefix).get("Contents", []))


@pytest.mark.parametrize(
    "fault",
    [Faults(reset_after=32 * 1024), Faults(stall_after=32 * 1024), Faults(refuse=True)],
    ids=["reset mid-upload", "stall mid-upload", "refused"],
)
def test_event_output_under_a_fault_is_503_leaves_nothing_and_its_redelivery_writes_one_object(
    start_predictor, proxy: FaultProxy, s3_server: str, fault: Faults
):
    predictor = start_predictor(AWS_ENDPOINT_URL=proxy.endpoint, ENGINE="onnx", S3_READ_TIMEOUT_S="2")
    s3 = s3_client(s3_server)  # straight to S3, past the proxy
    s3.create_bucket(Bucket=OUTPUTS)
    prefix = f"jobs-{uuid.uuid4().hex[:8]}/"
    data = {"text": SENTENCE, "format": "wav", "output": f"s3://{OUTPUTS}/{prefix}out.wav"}
    event_id = uuid.uuid4().hex

    proxy.set(fault)
    failed = _event(predictor, event_id, data)
    proxy.clear()

    # A retryable 5xx class: the broker redelivers (503: storage unreachable or timed out).
    assert failed.status_code == 503, failed.text
    assert "retry later" in failed.json()["error"]
    assert _objects(s3, prefix) == []  # no partial object, no completion record
    # A failure reply is final: what the stalled connection still held, relayed now that the fault is
    # gone, cannot make the output appear after the caller was told it failed.
    time.sleep(_LATE_WRITE_S)
    assert _objects(s3, prefix) == []
    again = _event(predictor, event_id, data)
    assert again.status_code == 200, again.text
    assert _objects(s3, prefix) == [f"{prefix}.tts-events/{_record_name(event_id)}", f"{prefix}out.wav"]
    body = s3.get_object(Bucket=OUTPUTS, Key=f"{prefix}out.wav")["Body"].read()
    assert hashlib.sha256(body).hexdigest() == again.json()["sha256"]


# How long a late write gets to land: the proxy relays what it held within milliseconds of the fault
# clearing, and moto applies a request as it arrives.
_LATE_WRITE_S = 1.5


def _record_name(event_id: str) -> str:
    from predictor.events.outputs import event_key

    return f"{event_key('/tests/faults', event_id)}.json"


def test_sigkill_during_a_multipart_event_output_then_redelivery_leaves_exactly_one_object(
    start_predictor, proxy: FaultProxy, s3_server: str, tmp_path: Path
):
    env = {"AWS_ENDPOINT_URL": proxy.endpoint, "ENGINE": "onnx", "CE_OUTPUT_PART_SIZE_MIB": "5"}
    predictor = start_predictor(MAX_TEXT_CHARS="8000", **env)
    s3 = s3_client(s3_server)
    s3.create_bucket(Bucket=OUTPUTS)
    prefix = f"multipart-{uuid.uuid4().hex[:8]}/"
    # Over 5 MiB of 16-bit PCM at 22050 Hz (about two minutes): a multipart upload of two parts.
    text = " ".join([SENTENCE, "It is long enough to need two parts of five mebibytes each."] * 20)
    data = {"text": text, "format": "pcm", "length_scale": 1.6, "output": f"s3://{OUTPUTS}/{prefix}out.pcm"}
    event_id = uuid.uuid4().hex
    proxy.set(Faults(bytes_per_s=1 * MiB))  # a slow link: the upload takes seconds

    def uploading() -> bool:
        uploads = s3.list_multipart_uploads(Bucket=OUTPUTS).get("Uploads", [])
        return any(u["Key"] == f"{prefix}out.pcm" for u in uploads)

    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(_event, predictor, event_id, data, 600)

        def answered() -> str | None:
            if not reply.done():
                return predictor.exit_reason()
            exc = reply.exception()
            return f"the event was answered ({exc or reply.result().status_code})"

        wait_until(
            uploading,
            600,
            what="the multipart upload under way",
            give_up=answered,
            details=predictor.log_tail,
        )
        _kill_container(predictor.proc.pid)
    predictor.proc.wait(10)
    assert _objects(s3, prefix) == []  # parts uploaded so far are invisible

    proxy.clear()
    restarted = start_predictor(MAX_TEXT_CHARS="8000", **env)
    again = _event(restarted, event_id, data, timeout=600)

    assert again.status_code == 200, again.text
    assert _objects(s3, prefix) == [f"{prefix}.tts-events/{_record_name(event_id)}", f"{prefix}out.pcm"]
    stored = s3.get_object(Bucket=OUTPUTS, Key=f"{prefix}out.pcm")
    body = stored["Body"].read()
    assert stored["ETag"].strip('"').endswith("-2")
    assert len(body) == again.json()["bytes"] > 5 * MiB
    assert hashlib.sha256(body).hexdigest() == again.json()["sha256"]


def test_a_stalled_shadow_sink_leaves_request_latency_as_it_was(
    start_predictor, proxy: FaultProxy, s3_server: str
):
    s3_client(s3_server).create_bucket(Bucket="shadow-faults")
    predictor = start_predictor(
        AWS_ENDPOINT_URL=proxy.endpoint,
        ENGINE="onnx",
        SHADOW_SINK="s3://shadow-faults/stable",
        SHADOW_BATCH_RECORDS="1",
        S3_READ_TIMEOUT_S="2",
    )

    def latency() -> float:
        start = time.monotonic()
        assert predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE)).status_code == 200
        return time.monotonic() - start

    baseline = statistics.median(latency() for _ in range(8))
    proxy.set(stall_after=0)  # every connection to S3 hangs, the sink's included
    stalled = statistics.median(latency() for _ in range(8))
    predictor.wait_for(
        lambda: predictor.metric("tts_shadow_records_total", outcome="lost") >= 1,
        120,
        "a batch given up on",
    )
    proxy.clear()

    assert stalled <= 1.5 * baseline, (stalled, baseline)
    written = predictor.metric("tts_shadow_records_total", outcome="written")
    predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE))
    predictor.wait_for(
        lambda: predictor.metric("tts_shadow_records_total", outcome="written") > written,
        60,
        "records written again once S3 answers",
    )


# --- the server as the manifests run it -------------------------------------------------------------

UID = 10001  # the image's user (Dockerfile USER, runAsUser in deploy/common/predictor)


def test_server_as_uid_10001_writes_only_model_dir_and_tmp(
    s3_server: str, published_voice: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    model_dir = Path(tempfile.mkdtemp(prefix="tts-uid-model-"))
    os.chown(model_dir, UID, UID)
    marker = time.time()
    env = {
        **aws_env(s3_server),
        "VOICE_URI": published_voice,
        "MODEL_DIR": str(model_dir),
        "HOME": "/tmp",  # as the manifests set it
        "CPU_THREADS": "1",
    }
    # Coverage's subprocess hook (make test) would write its data into the repository, which this
    # user may not: that write is the harness's, not the server's.
    for name in [k for k in os.environ if k.startswith("COVERAGE")]:
        monkeypatch.delenv(name)
    predictor = PredictorProcess(env, tmp_path / "uid.log", user=UID)
    try:
        predictor.wait_ready()
        assert predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE)).status_code == 200
        assert predictor.post("/v1/audio/speech", json=speech_request(SENTENCE, "mp3")).status_code == 200
        status = psutil.Process(predictor.proc.pid).uids()
        assert status.real == status.effective == UID
    finally:
        predictor.stop()
        shutil.rmtree(model_dir, ignore_errors=True)

    found = subprocess.run(
        [
            "find",
            "/",
            "-xdev",
            "(",
            "-path",
            "/proc",
            "-o",
            "-path",
            str(model_dir),
            ")",
            "-prune",
            "-o",
            "-user",
            str(UID),
            "-newermt",
            f"@{marker}",
            "-print",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    outside = [p for p in found if not p.startswith("/tmp/") and p != "/tmp"]
    assert outside == [], outside
