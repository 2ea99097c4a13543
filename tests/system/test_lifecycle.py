"""Cold start, readiness, restarts, faults during fetch, configuration errors and drain on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import tritonclient.grpc as triton_grpc

from testing.bodies import v2_request
from testing.s3 import SECRET, s3_client

LONG_TEXT = " ".join(
    ["The weights arrive, the engine warms up, and only then do we say that we are ready."] * 7
)
READINESS_PATHS = ("/v2/models/tts/ready", "/v1/models/tts", "/v2/health/ready")


def wait_for_log(predictor, needle: str, timeout: float = 60.0) -> str:
    def logged() -> str:
        logs = predictor.logs()
        return logs if needle in logs else ""

    return predictor.wait_for(logged, timeout, f"{needle!r} logged", interval=0.1)


def test_not_ready_until_warm_while_liveness_answers(start_predictor):
    # A long warm-up text stretches the window between "serving HTTP" and "warm".
    predictor = start_predictor(wait=False, WARMUP_TEXT=LONG_TEXT)
    predictor.wait_live()

    codes = {path: predictor.get(path).status_code for path in READINESS_PATHS}
    infer = predictor.post("/v2/models/tts/infer", json=v2_request("Too early."))
    live = [predictor.get("/v2/health/live") for _ in range(10)]
    grpc_client = triton_grpc.InferenceServerClient(predictor.grpc)
    grpc_ready = (
        grpc_client.is_server_ready(),
        grpc_client.is_model_ready("tts"),
        grpc_client.is_server_live(),
    )

    assert "model ready" not in predictor.logs(), "warm-up finished before the checks; lengthen LONG_TEXT"
    assert codes == dict.fromkeys(READINESS_PATHS, 503)
    assert infer.status_code == 503 and "not ready" in infer.json()["error"]
    assert all(r.status_code == 200 for r in live)
    assert grpc_ready == (False, False, True)
    predictor.wait_ready()
    assert all(predictor.get(path).status_code == 200 for path in READINESS_PATHS)
    assert grpc_client.is_server_ready() and grpc_client.is_model_ready("tts")


def test_liveness_answers_during_a_long_synthesis(predictor):
    # If synthesis ran on the event loop, each probe would wait seconds for it to finish.
    body = v2_request(LONG_TEXT * 2)
    worker = threading.Thread(target=predictor.post, args=("/v2/models/tts/infer",), kwargs={"json": body})
    worker.start()
    predictor.wait_for(
        lambda: predictor.metric("tts_in_flight_requests") >= 1, 60, "a request in flight", interval=0.01
    )

    latencies = []
    while worker.is_alive() and len(latencies) < 20:
        start = time.perf_counter()
        assert predictor.get("/v2/health/live").status_code == 200
        latencies.append(time.perf_counter() - start)
    worker.join()

    assert len(latencies) >= 5
    # Generous bound for a loaded 2-core CI machine; the figures are measured by `python -m bench liveness`.
    assert max(latencies) < 1.0, latencies


def test_restart_skips_verified_files(start_predictor, tmp_path):
    model_dir = str(tmp_path / "emptydir")
    first = start_predictor(MODEL_DIR=model_dir)
    assert first.metric("tts_fetch_bytes_total") > 60_000_000
    assert first.stop() == 0

    second = start_predictor(MODEL_DIR=model_dir)

    assert second.metric("tts_fetch_bytes_total") == 0
    assert second.metric("tts_fetch_files_total", outcome="skipped") == 4  # the torch engine's files
    assert second.post("/v2/models/tts/infer", json=v2_request("Back again.")).status_code == 200


def publish_corrupt_copy(s3_server, voice_dir, prefix: str):
    """A copy of the voice whose weights were swapped for same-size garbage after publishing."""
    client = s3_client(s3_server)
    for path in sorted(voice_dir.iterdir()):
        client.upload_file(str(path), "voices", f"{prefix}/{path.name}")
    size = (voice_dir / "model.safetensors").stat().st_size
    client.put_object(Bucket="voices", Key=f"{prefix}/model.safetensors", Body=os.urandom(size))
    return client


def fetch_attempt_warnings(predictor) -> list[str]:
    """The log's "fetch attempt N/M failed" messages, in order (one per whole-artifact retry)."""
    records = [json.loads(line) for line in predictor.logs().splitlines() if line.startswith("{")]
    return [r["msg"].split(",")[0] for r in records if r["msg"].startswith("fetch attempt")]


def test_corrupted_object_keeps_model_not_ready(start_predictor, s3_server, voice_dir):
    publish_corrupt_copy(s3_server, voice_dir, "corrupt")

    predictor = start_predictor(wait=False, VOICE_URI="s3://voices/corrupt", FETCH_BACKOFF_S="0.01")

    logs = wait_for_log(predictor, "the model stays not ready")
    predictor.wait_live()  # the fetch fails on its own thread, possibly before the server listens
    assert "sha256" in logs
    # Three whole-artifact attempts (serving/coldstart.py ARTIFACT_RETRIES = 2): two retried, the third final.
    assert fetch_attempt_warnings(predictor) == ["fetch attempt 1/3 failed", "fetch attempt 2/3 failed"]
    assert predictor.get("/v2/models/tts/ready").status_code == 503
    assert predictor.get("/v2/health/live").status_code == 200
    assert not os.path.exists(os.path.join(predictor.env["MODEL_DIR"], "model.safetensors")), (
        "a corrupt file landed"
    )


def test_a_corrupt_first_attempt_then_a_good_object_is_ready_after_exactly_two_attempts(
    start_predictor, s3_server, voice_dir
):
    client = publish_corrupt_copy(s3_server, voice_dir, "repaired")
    # The first retry waits FETCH_BACKOFF_S x 4 = 8 s +-50 % (coldstart.artifact_policy): time to put the good weights back.
    predictor = start_predictor(wait=False, VOICE_URI="s3://voices/repaired", FETCH_BACKOFF_S="2")
    wait_for_log(predictor, "fetch attempt 1/3 failed")
    client.upload_file(str(voice_dir / "model.safetensors"), "voices", "repaired/model.safetensors")

    predictor.wait_ready()

    assert fetch_attempt_warnings(predictor) == ["fetch attempt 1/3 failed"]
    # The second attempt fetched only the file that failed; the first had verified the other three.
    assert predictor.metric("tts_fetch_files_total", outcome="downloaded") == 1
    assert predictor.metric("tts_fetch_files_total", outcome="skipped") == 3
    assert predictor.post("/v2/models/tts/infer", json=v2_request("Repaired.")).status_code == 200


def test_missing_artifact_keeps_model_not_ready(start_predictor):
    predictor = start_predictor(wait=False, VOICE_URI="s3://voices/no-such-voice", FETCH_BACKOFF_S="0.01")

    logs = wait_for_log(predictor, "the model stays not ready")
    predictor.wait_live()  # the fetch fails on its own thread, possibly before the server listens

    assert "manifest.json" in logs
    assert predictor.get("/v2/models/tts/ready").status_code == 503


def test_cuda_device_without_gpu_fails_at_start(start_predictor):
    predictor = start_predictor(wait=False, DEVICE="cuda")

    code = predictor.proc.wait(timeout=90)

    assert code != 0
    assert "DEVICE=cuda" in predictor.logs() and "CUDA" in predictor.logs()


@pytest.mark.parametrize(
    ("variable", "value"),
    [("HTTP_PORT", "eighty"), ("FETCH_CONCURRENCY", "0"), ("DEVICE", "tpu"), ("LOG_LEVEL", "LOUD")],
)
def test_invalid_setting_fails_naming_the_variable(variable, value):
    env = {**os.environ, variable: value}

    run = subprocess.run(
        [sys.executable, "-m", "predictor", "serve"], env=env, capture_output=True, text=True, timeout=60
    )

    assert run.returncode == 2
    assert variable in run.stderr


def test_sigterm_finishes_in_flight_requests_then_exits(start_predictor):
    predictor = start_predictor()
    results: dict[str, httpx.Response] = {}
    body = v2_request(LONG_TEXT)
    worker = threading.Thread(
        target=lambda: results.setdefault("inflight", predictor.post("/v2/models/tts/infer", json=body))
    )
    worker.start()
    predictor.wait_for(
        lambda: predictor.metric("tts_in_flight_requests") >= 1, 60, "a request in flight", interval=0.01
    )

    predictor.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    during = _status_or_refused(predictor, "/v2/models/tts/ready")
    refused_infer = _status_or_refused(predictor, "/v2/models/tts/infer", json=v2_request("Too late."))
    worker.join(timeout=120)
    code = predictor.proc.wait(timeout=60)

    assert results["inflight"].status_code == 200
    assert results["inflight"].json()["outputs"][1]["data"][0] > 22050 * 10  # the whole text, not cut short
    assert during in (503, "refused") and refused_infer in (503, "refused")
    assert code == 0


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_while_the_engines_other_copies_are_made_exits_0_with_a_clean_log(start_predictor, workers):
    # Two CPU threads: the lanes' copy (engine/lanes.py) is made once idle after ready, the workers'
    # copies at ready. A SIGTERM while one was being made aborted the process (std::terminate, -6);
    # the signal lands at a few points around that making, each on a fresh predictor.
    for delay_s in (0.0, 0.25, 0.35):
        predictor = start_predictor(ENGINE="auto", CPU_THREADS="2", ENGINE_WORKERS=workers)
        assert predictor.post("/v2/models/tts/infer", json=v2_request("Hello.")).status_code == 200
        time.sleep(delay_s)

        code = predictor.stop()

        assert code == 0, predictor.logs()[-2000:]
        assert "terminate called" not in predictor.logs()


def test_no_credentials_in_logs_or_metrics(predictor):
    predictor.post("/v2/models/tts/infer", json=v2_request("Secrets stay secret."))

    assert SECRET not in predictor.logs()
    assert SECRET not in predictor.get("/metrics").text


def _status_or_refused(predictor, path: str, **kwargs):
    try:
        if "json" in kwargs:
            return predictor.post(path, timeout=10, **kwargs).status_code
        return predictor.get(path).status_code
    except httpx.TransportError:
        return "refused"
