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
import signal
import subprocess
import time
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
from testing.faults import Faults, FaultProxy
from testing.polling import wait_until

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
