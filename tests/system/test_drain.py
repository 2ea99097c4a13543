"""SIGTERM drains by request: whatever was admitted before it runs to its end; nothing after it is served.

Each test starts its own predictor (SIGTERM ends it) from a "quiet" copy of the default voice, whose
config.json sets noise_scale = noise_w = 0, so every route (the speech route cannot set noise) answers
the same text with the same audio, and a response cut short shows as a different one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from predictor.artifact.publish import publish
from testing.bodies import speech_request, v2_request
from testing.polling import wait_until
from testing.s3 import aws_env, s3_client

SENTENCES = [
    "The first sentence opens the stream.",
    "A second one follows it closely.",
    "The third keeps the engine busy.",
    "Then comes the fourth, a little longer than the others were.",
    "The fifth is where the old drain cut streams off.",
    "Six sentences in, the pod is already draining.",
    "The seventh still belongs to the same request.",
    "An eighth keeps the client waiting for more.",
    "The ninth is nearly the last.",
    "And the tenth closes the stream for good.",
]
STREAM_TEXT = " ".join(SENTENCES)
LONG_TEXT = " ".join(
    ["The weights arrive, the engine warms up, and only then do we say that we are ready."] * 6
)
BUCKET = "drain-outputs"


@pytest.fixture(scope="module")
def quiet_voice(s3_server: str, voice_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The default voice with noise_scale = noise_w = 0 in its config.json, published to S3."""
    out = tmp_path_factory.mktemp("quiet-voice")
    for path in voice_dir.iterdir():
        shutil.copy(path, out / path.name)
    config = json.loads((out / "config.json").read_text())
    config.setdefault("inference", {}).update(noise_scale=0.0, noise_w=0.0)
    raw = json.dumps(config).encode()
    (out / "config.json").write_bytes(raw)
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["files"]:
        if entry["path"] == "config.json":
            entry.update(size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.MonkeyPatch.context() as env:
        for name, value in aws_env(s3_server).items():
            env.setenv(name, value)
        publish(out, "s3://voices/quiet", endpoint_url=s3_server)
    return "s3://voices/quiet"


@pytest.fixture
def start_quiet(start_predictor, quiet_voice):
    def start(**env: str):
        # Segments of one sentence each: the ten-sentence text is a ten-segment stream.
        return start_predictor(VOICE_URI=quiet_voice, MAX_SEGMENT_CHARS="70", **env)

    return start


def _refused_or_status(call) -> int | str:
    try:
        return call().status_code
    except httpx.TransportError:
        return "refused"


def _sigterm_when(predictor, condition, what: str) -> None:
    wait_until(condition, 120, what=what)
    predictor.proc.send_signal(signal.SIGTERM)


def _stream(predictor, rid: str, on_chunk=None) -> tuple[int, bytes]:
    body = b""
    with httpx.stream(
        "POST",
        predictor.url + "/v1/audio/speech",
        timeout=120,
        json=speech_request(STREAM_TEXT, "pcm", stream=True),
        headers={"x-request-id": rid},
    ) as response:
        for chunk in response.iter_bytes():
            body += chunk
            if on_chunk is not None:
                on_chunk(body)
        return response.status_code, body


def test_sigterm_during_a_ten_segment_stream_delivers_the_whole_body(start_quiet):
    predictor = start_quiet()
    status, whole = _stream(predictor, "baseline")  # the same text, no SIGTERM
    assert status == 200 and len(whole) > 22050 * 2 * 10  # ten sentences: well over ten seconds

    signalled = threading.Event()
    during: dict[str, object] = {}

    def on_chunk(body: bytes) -> None:
        # After the first segment arrived, nine are still to come: the pod starts draining now.
        if not signalled.is_set():
            predictor.proc.send_signal(signal.SIGTERM)
            signalled.set()
            time.sleep(0.3)
            during["ready"] = _refused_or_status(lambda: predictor.get("/v2/models/tts/ready"))
            during["new"] = _refused_or_status(
                lambda: predictor.post("/v1/audio/speech", json=speech_request("Too late.", "pcm"))
            )

    status, drained = _stream(predictor, "drained", on_chunk)
    code = predictor.proc.wait(timeout=60)

    assert status == 200
    assert len(drained) == len(whole)  # every segment arrived, none cut off
    assert drained == whole  # and it is the same audio (no noise)
    assert during == {"ready": 503, "new": 503}
    assert code == 0
    assert "drain timed out" not in predictor.logs()


def test_sigterm_during_an_event_with_a_multipart_output_completes_upload_and_record(start_quiet):
    predictor = start_quiet(CE_OUTPUT_PART_SIZE_MIB="5", MAX_TEXT_CHARS="8000", ENGINE="onnx")
    s3 = s3_client(predictor.env["AWS_ENDPOINT_URL"])
    s3.create_bucket(Bucket=BUCKET)
    key = f"jobs/{uuid.uuid4().hex}.pcm"
    # Over 5 MiB of 16-bit PCM at 22050 Hz (about two minutes): two parts.
    data = {"text": " ".join(SENTENCES * 4), "format": "pcm", "output": f"s3://{BUCKET}/{key}"}
    data["length_scale"] = 1.6
    headers = {
        "ce-specversion": "1.0",
        "ce-type": "dev.tts-predictor.synthesize.v1",
        "ce-source": "/tests/drain",
        "ce-id": uuid.uuid4().hex,
        "content-type": "application/json",
    }
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            predictor.post, "/v1/models/tts:predict", headers=headers, content=json.dumps(data), timeout=300
        )
        _sigterm_when(predictor, lambda: predictor.metric("tts_in_flight_requests") >= 1, "event in flight")
        response = reply.result(timeout=300)
    code = predictor.proc.wait(timeout=60)

    assert response.status_code == 200, response.text
    written = response.json()
    stored = s3.get_object(Bucket=BUCKET, Key=key)
    body = stored["Body"].read()
    assert stored["ETag"].strip('"').endswith("-2"), stored["ETag"]  # a multipart upload of two parts
    assert len(body) == written["bytes"] > 5 * 1024 * 1024
    assert hashlib.sha256(body).hexdigest() == written["sha256"]
    records = s3.list_objects_v2(Bucket=BUCKET, Prefix="jobs/.tts-events/").get("Contents", [])
    assert len(records) == 1  # the completion record, written after the audio
    assert code == 0


def test_sigterm_during_a_grpc_call_answers_it_whole(start_quiet):
    predictor = start_quiet()
    client = triton_grpc.InferenceServerClient(predictor.grpc)

    def infer(text: str):
        item = triton_grpc.InferInput("text", [1], "BYTES")
        item.set_data_from_numpy(np.array([text.encode()], dtype=object))
        return client.infer("tts", [item])

    baseline = infer(LONG_TEXT).as_numpy("audio_length")[0]
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(infer, LONG_TEXT)
        _sigterm_when(predictor, lambda: predictor.metric("tts_in_flight_requests") >= 1, "call in flight")
        time.sleep(0.3)
        with pytest.raises(InferenceServerException) as refused:
            infer("Too late.")
        answer = call.result(timeout=120)
    code = predictor.proc.wait(timeout=60)

    assert answer.as_numpy("audio_length")[0] == baseline > 22050 * 5
    assert refused.value.status() == "StatusCode.UNAVAILABLE", refused.value
    assert code == 0


def test_drain_timeout_cuts_a_longer_request_off_names_it_and_exits_0(start_quiet):
    predictor = start_quiet(DRAIN_TIMEOUT_S="1")
    rid = "still-speaking-" + uuid.uuid4().hex[:8]
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(_refused_or_status_stream, predictor, rid)
        _sigterm_when(predictor, lambda: predictor.metric("tts_in_flight_requests") >= 1, "stream in flight")
        signalled = time.monotonic()
        code = predictor.proc.wait(timeout=60)
        exited_after = time.monotonic() - signalled
        outcome = stream.result(timeout=60)

    logs = predictor.logs()
    assert code == 0
    assert exited_after < 10  # DRAIN_TIMEOUT_S=1, then a second's grace: not the stream's whole length
    assert outcome != "whole"
    cut = next(line for line in logs.splitlines() if "cutting off" in line)
    assert rid in cut and "drain timed out" in cut and "/v1/audio/speech" in cut


def _refused_or_status_stream(predictor, rid: str) -> str:
    try:
        status, body = _stream(predictor, rid)
    except httpx.TransportError:
        return "cut"
    return "whole" if status == 200 and len(body) > 22050 * 2 * 10 else f"{status}/{len(body)}"


def test_sigterm_under_load_completes_or_refuses_every_request_cleanly(start_quiet):
    predictor = start_quiet()
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    signalled = threading.Event()
    short = v2_request("Load keeps coming.")
    expected = predictor.post("/v2/models/tts/infer", json=short).json()["outputs"][1]["data"][0]

    def client() -> None:
        # As behind a load balancer: keep sending until refused; a refusal moves traffic elsewhere.
        while True:
            try:
                response = predictor.post("/v2/models/tts/infer", json=short, timeout=120)
            except httpx.ConnectError:
                outcome = "refused before acceptance"
            except httpx.TransportError as exc:
                outcome = f"lost: {type(exc).__name__}"
            else:
                if response.status_code == 200:
                    length = response.json()["outputs"][1]["data"][0]
                    outcome = "completed" if length == expected else f"short: {length}"
                else:
                    outcome = f"status {response.status_code}"
            with lock:
                outcomes[outcome + (" after SIGTERM" if signalled.is_set() else "")] += 1
            if outcome != "completed":
                return

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: sum(outcomes.values()) >= 6, 120, what="six requests answered under load")
    predictor.proc.send_signal(signal.SIGTERM)
    signalled.set()
    for t in threads:
        t.join(timeout=180)
    code = predictor.proc.wait(timeout=60)

    clean = {
        "completed",
        "completed after SIGTERM",
        "status 503 after SIGTERM",
        "refused before acceptance after SIGTERM",
    }
    assert set(outcomes) <= clean, outcomes
    refusals = sum(v for k, v in outcomes.items() if not k.startswith("completed"))
    assert refusals == 4, outcomes  # each client stopped at its one clean refusal; nothing else failed
    assert outcomes["completed after SIGTERM"] >= 1, outcomes  # requests admitted before it were served
    assert code == 0
