"""Synthesis events as a Knative broker delivers them: outputs in S3 exactly once, redelivery, errors the bus understands.

Against real components: moto's S3 server and predictor processes over real sockets.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import io
import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile
from botocore.exceptions import ClientError

from predictor.config import Settings
from predictor.errors import OutputError
from predictor.events.outputs import EncodedAudio, OutputStore, event_key, parse_output_uri
from testing.audio import check_encoded
from testing.bodies import v2_request
from testing.ports import free_port
from testing.s3 import aws_env, s3_client
from testing.s3_relay import S3Relay, Seen

REQUEST_TYPE = "dev.tts-predictor.synthesize.v1"
REPLY_TYPE = "dev.tts-predictor.synthesized.v1"
BUCKET = "event-outputs"
SENTENCE = "Every event lands in storage exactly once."
QUIET = {"noise_scale": 0.0, "noise_w": 0.0}


@pytest.fixture(scope="module")
def s3(s3_server: str):
    """A boto3 client on moto, with a versioned bucket: a second write of a key shows as a second version."""
    client = s3_client(s3_server)
    client.create_bucket(Bucket=BUCKET)
    client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return client


def fresh_output(fmt: str = "wav") -> str:
    return f"s3://{BUCKET}/jobs/{uuid.uuid4().hex}.{fmt}"


def send_binary(predictor, event_id: str, data: dict, *, event_type: str = REQUEST_TYPE) -> httpx.Response:
    headers = {
        "ce-specversion": "1.0",
        "ce-type": event_type,
        "ce-source": "/tests/events",
        "ce-id": event_id,
        "content-type": "application/json",
    }
    return predictor.post("/v1/models/tts:predict", headers=headers, content=json.dumps(data))


def send_structured(predictor, event_id: str, data: dict) -> httpx.Response:
    event = {
        "specversion": "1.0",
        "type": REQUEST_TYPE,
        "source": "/tests/events",
        "id": event_id,
        "datacontenttype": "application/json",
        "data": data,
    }
    return predictor.post(
        "/v1/models/tts:predict",
        headers={"content-type": "application/cloudevents+json"},
        content=json.dumps(event),
    )


def key_of(uri: str) -> str:
    return uri.removeprefix(f"s3://{BUCKET}/")


def versions(s3, uri: str) -> list[dict]:
    listing = s3.list_object_versions(Bucket=BUCKET, Prefix=key_of(uri))
    return [v for v in listing.get("Versions", []) if v["Key"] == key_of(uri)]


def download(s3, uri: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key_of(uri))["Body"].read()


def syntheses(predictor) -> float:
    return predictor.metric("tts_synthesis_seconds_count")


# --- outputs land in S3 ----------------------------------------------------------------------
def test_binary_event_output_lands_in_s3_with_the_replied_sha256(predictor, s3, reference):
    output = fresh_output()

    response = send_binary(predictor, "out-binary-1", {"text": SENTENCE, "output": output, **QUIET})

    assert response.status_code == 200, response.text
    assert response.headers["ce-type"] == REPLY_TYPE != REQUEST_TYPE
    assert response.headers["ce-inreplyto"] == "out-binary-1"
    data = response.json()
    stored = download(s3, output)
    assert data["uri"] == output and data["format"] == "wav"
    assert data["sha256"] == hashlib.sha256(stored).hexdigest() and data["bytes"] == len(stored)
    audio, rate = soundfile.read(io.BytesIO(stored), dtype="float32")
    assert rate == data["sample_rate"] == 22050
    assert abs(len(audio) / rate - data["audio_seconds"]) < 0.01
    check_encoded(stored, "wav", reference.speak(SENTENCE), 22050)


def test_structured_event_output_in_flac_lands_with_its_media_type(predictor, s3):
    output = fresh_output("flac")

    response = send_structured(
        predictor, "out-structured-1", {"text": SENTENCE, "output": output, "format": "flac"}
    )

    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/cloudevents+json")
    reply = response.json()
    assert reply["type"] == REPLY_TYPE and reply["inreplyto"] == "out-structured-1"
    stored = s3.get_object(Bucket=BUCKET, Key=key_of(output))
    body = stored["Body"].read()
    assert stored["ContentType"] == "audio/flac"
    assert reply["data"]["format"] == "flac" and reply["data"]["sha256"] == hashlib.sha256(body).hexdigest()
    assert soundfile.info(io.BytesIO(body)).format == "FLAC"


def test_inline_reply_carries_audio_format_and_checksum(predictor, reference):
    response = send_binary(predictor, "inline-1", {"text": SENTENCE, "format": "pcm", **QUIET})

    assert response.status_code == 200, response.text
    data = response.json()
    pcm = base64.b64decode(data["audio_base64"], validate=True)
    assert data["format"] == "pcm" and data["bytes"] == len(pcm)
    assert abs(len(pcm) / 2 / data["sample_rate"] - data["audio_seconds"]) < 1e-3
    assert data["sha256"] == hashlib.sha256(pcm).hexdigest()
    check_encoded(pcm, "pcm", reference.speak(SENTENCE), data["sample_rate"])


# --- exactly one output ----------------------------------------------------------------------
def test_redelivery_replies_the_same_without_synthesis_or_second_object(predictor, s3):
    output = fresh_output()
    data = {"text": SENTENCE, "output": output, **QUIET}
    first = send_binary(predictor, "redeliver-1", data)
    assert first.status_code == 200, first.text
    syntheses_before = syntheses(predictor)

    again = send_structured(predictor, "redeliver-1", data)

    assert again.status_code == 200, again.text
    reply = again.json()
    assert reply["data"] == first.json()
    assert reply["id"] == first.headers["ce-id"] and reply["time"] == first.headers["ce-time"]
    assert syntheses(predictor) == syntheses_before
    assert len(versions(s3, output)) == 1


def test_concurrent_duplicates_synthesize_once(predictor, s3):
    output = fresh_output()
    # One sentence, so one segment: one engine call when synthesized once.
    data = {"text": SENTENCE[:-1] + ", said four times at once.", "output": output, **QUIET}
    syntheses_before = syntheses(predictor)

    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: send_binary(predictor, "concurrent-1", data), range(4)))

    assert [r.status_code for r in responses] == [200] * 4, [r.text for r in responses]
    assert len({r.content for r in responses}) == 1
    assert len({r.headers["ce-id"] for r in responses}) == 1
    assert syntheses(predictor) == syntheses_before + 1
    assert len(versions(s3, output)) == 1


def test_redelivery_with_other_data_replies_from_the_first_completion(predictor, s3):
    output = fresh_output()
    first = send_binary(predictor, "reused-id-1", {"text": SENTENCE, "output": output, **QUIET})
    syntheses_before = syntheses(predictor)

    again = send_binary(
        predictor, "reused-id-1", {"text": "Something else entirely.", "output": output, **QUIET}
    )

    assert again.status_code == 200 and again.json() == first.json()
    assert syntheses(predictor) == syntheses_before
    assert len(versions(s3, output)) == 1
    assert "redelivered with different data" in predictor.logs()


def test_output_whose_record_was_lost_is_recovered_not_rewritten(predictor, s3):
    output = fresh_output()
    data = {"text": SENTENCE, "output": output, **QUIET}
    first = send_binary(predictor, "crashed-1", data)
    assert first.status_code == 200, first.text
    # As if the process died between the audio upload and the completion record.
    record_key = parse_output_uri(output).record_key(event_key("/tests/events", "crashed-1"))
    s3.delete_object(Bucket=BUCKET, Key=record_key)
    syntheses_before = syntheses(predictor)

    again = send_binary(predictor, "crashed-1", data)

    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert syntheses(predictor) == syntheses_before
    assert len(versions(s3, output)) == 1
    assert json.loads(s3.get_object(Bucket=BUCKET, Key=record_key)["Body"].read())["reply"] == first.json()


def test_redelivery_after_restart_writes_no_second_object(start_predictor, s3):
    output = fresh_output()
    data = {"text": SENTENCE, "output": output, **QUIET}
    before_restart = start_predictor()
    first = send_binary(before_restart, "restart-1", data)
    assert first.status_code == 200, first.text
    assert before_restart.stop() == 0
    after_restart = start_predictor()
    syntheses_before = syntheses(after_restart)

    again = send_binary(after_restart, "restart-1", data)

    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert again.headers["ce-id"] == first.headers["ce-id"]
    assert syntheses(after_restart) == syntheses_before
    assert after_restart.metric("tts_event_outputs_total", outcome="replayed") == 1
    assert len(versions(s3, output)) == 1
    after_restart.stop()


# --- invalid events: 400, never retried ------------------------------------------------------
@pytest.mark.parametrize(
    ("event_type", "data", "says"),
    [
        ("com.example.other.v1", {"text": SENTENCE}, "unsupported event type"),
        (REQUEST_TYPE, {"output": f"s3://{BUCKET}/jobs/no-text.wav"}, "must be a JSON object"),
        (REQUEST_TYPE, {"text": "   ", "output": f"s3://{BUCKET}/jobs/blank.wav"}, "empty or whitespace"),
        (REQUEST_TYPE, {"text": SENTENCE, "output": "http://example.com/a.wav"}, "s3://bucket/key"),
        (REQUEST_TYPE, {"text": SENTENCE, "output": f"s3://{BUCKET}/jobs/"}, "s3://bucket/key"),
        (REQUEST_TYPE, {"text": SENTENCE, "output": f"s3://{BUCKET}/jobs/.tts-events/x.json"}, ".tts-events"),
        (REQUEST_TYPE, {"text": SENTENCE, "format": "aiff"}, "data.format 'aiff' is not supported"),
        (
            REQUEST_TYPE,
            {"text": SENTENCE, "output": "s3://no-such-bucket-for-events/a.wav"},
            "does not exist",
        ),
        (REQUEST_TYPE, {"text": SENTENCE, "speed": 2}, "unknown parameter 'speed'"),
    ],
    ids=[
        "bad-type",
        "missing-text",
        "blank-text",
        "http-output",
        "no-key",
        "record-dir",
        "unknown-format",
        "missing-bucket",
        "unknown-parameter",
    ],
)
def test_invalid_event_is_refused_with_400(predictor, s3, event_type, data, says):
    response = send_binary(predictor, f"invalid-{uuid.uuid4().hex}", data, event_type=event_type)

    assert response.status_code == 400, response.text
    assert says in response.json()["error"]
    assert predictor.post("/v2/models/tts/infer", json=v2_request("Still here.")).status_code == 200


# --- a predictor whose S3 is down ------------------------------------------------------------
@pytest.fixture(scope="module")
def isolated_predictor(start_predictor, voice_dir, tmp_path_factory):
    """A predictor serving a local artifact, its S3 endpoint a port nothing listens on, inline cap 20 kB."""
    model_dir = tmp_path_factory.mktemp("local-model") / "model"
    shutil.copytree(voice_dir, model_dir)
    p = start_predictor(
        VOICE_URI="",
        MODEL_DIR=str(model_dir),
        # free_port closes the port on return: connections to it are refused.
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        CE_INLINE_MAX_BYTES="20000",
    )
    yield p
    p.stop()


def test_unreachable_storage_answers_503_and_server_keeps_serving(isolated_predictor):
    response = send_binary(isolated_predictor, "s3-down-1", {"text": SENTENCE, "output": fresh_output()})

    assert response.status_code == 503, response.text
    assert "unreachable" in response.json()["error"] and "retry" in response.json()["error"]
    assert isolated_predictor.post("/v2/models/tts/infer", json=v2_request(SENTENCE)).status_code == 200
    assert "event output failed" in isolated_predictor.logs()


def test_inline_audio_over_the_limit_is_refused_with_413_naming_output(isolated_predictor):
    response = send_binary(isolated_predictor, "too-big-1", {"text": SENTENCE})

    assert response.status_code == 413, response.text
    assert (
        "CE_INLINE_MAX_BYTES=20000" in response.json()["error"] and "data.output" in response.json()["error"]
    )


# --- the output store on its own, against moto and a failing endpoint ------------------------
def _audio(size: int) -> EncodedAudio:
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    return EncodedAudio(
        data=data, format="pcm", media_type="audio/pcm", sample_rate=22050, audio_seconds=size / 44100
    )


async def _produce_once(audio: EncodedAudio, calls: list[int]) -> EncodedAudio:
    calls.append(1)
    return audio


def test_large_output_goes_up_as_one_multipart_object(s3_env, s3):
    store = OutputStore(Settings(ce_output_part_size_mib=5))
    audio = _audio(11 * 1024 * 1024)
    target = parse_output_uri(fresh_output("pcm"))
    calls: list[int] = []

    completion = asyncio.run(store.complete(target, "k" * 64, "d", lambda: _produce_once(audio, calls)))

    head = s3.head_object(Bucket=BUCKET, Key=target.key)
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # 5 + 5 + 1 MiB parts
    assert hashlib.sha256(download(s3, target.uri)).hexdigest() == completion.data["sha256"] == audio.sha256
    assert calls == [1]


class _Failing(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint whose every answer is 500 InternalError."""

    def _fail(self) -> None:
        body = b"<Error><Code>InternalError</Code><Message>boom</Message></Error>"
        self.send_response(500)
        self.send_header("content-type", "application/xml")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = _fail

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def failing_s3(monkeypatch) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    for name, value in aws_env(endpoint).items():
        monkeypatch.setenv(name, value)
    yield endpoint
    server.shutdown()
    server.server_close()


def test_storage_5xx_is_a_502_the_broker_retries_and_nothing_is_synthesized(failing_s3):
    store = OutputStore(Settings())
    calls: list[int] = []

    with pytest.raises(OutputError) as raised:
        asyncio.run(
            store.complete(
                parse_output_uri("s3://b/k.wav"), "k" * 64, "d", lambda: _produce_once(_audio(10), calls)
            )
        )

    assert raised.value.http_status == 502 and "InternalError" in raised.value.message
    assert (
        calls == []
    )  # the record lookup failed first: no engine time spent on an event that will be retried


def test_two_replicas_racing_on_one_event_write_one_object(s3_env, s3, monkeypatch):
    # Completions go to moto one at a time, as S3 decides conditional writes (testing/s3_relay.py).
    relay = S3Relay(s3_env, one_at_a_time=lambda method, path: method == "POST" and "uploadId=" in path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    replicas = [OutputStore(Settings()), OutputStore(Settings())]
    target = parse_output_uri(fresh_output("pcm"))
    audio = _audio(4096)
    produced: list[int] = []

    async def race() -> list:
        both_looked = asyncio.Barrier(2)  # each replica has found no record and no object

        async def produce() -> EncodedAudio:
            produced.append(1)
            await both_looked.wait()
            return audio

        return await asyncio.gather(*(r.complete(target, "r" * 64, "d", produce) for r in replicas))

    try:
        first, second = asyncio.run(race())
    finally:
        relay.close()

    assert produced == [1, 1]
    assert first.data == second.data and first.data["sha256"] == audio.sha256
    assert len(versions(s3, target.uri)) == 1


def test_two_replicas_racing_with_multipart_outputs_write_one_object_and_abort_the_other(
    s3_env, s3, monkeypatch
):
    # Counts the parts, completions and aborts; spoils nothing. Completions go to moto one at a time,
    # as S3 decides conditional writes (testing/s3_relay.py says why moto needs this).
    relay = S3Relay(s3_env, one_at_a_time=lambda method, path: method == "POST" and "uploadId=" in path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    replicas = [OutputStore(Settings(ce_output_part_size_mib=5)) for _ in range(2)]
    target = parse_output_uri(fresh_output("pcm"))
    audio = _audio(11 * 1024 * 1024)  # three parts each: 5 + 5 + 1 MiB

    async def race() -> list:
        both_looked = asyncio.Barrier(2)

        async def produce() -> EncodedAudio:
            await both_looked.wait()
            return audio

        return await asyncio.gather(*(r.complete(target, "m" * 64, "d", produce) for r in replicas))

    try:
        first, second = asyncio.run(race())
    finally:
        relay.close()

    assert first.data == second.data and first.data["sha256"] == audio.sha256
    assert len(versions(s3, target.uri)) == 1
    assert hashlib.sha256(download(s3, target.uri)).hexdigest() == audio.sha256
    assert len(relay.requests("PUT", "partNumber=")) == 6  # both uploaded every part
    assert len(relay.requests("POST", "uploadId=")) == 2  # both tried to complete, one was refused
    assert len(relay.requests("DELETE", "uploadId=")) == 1  # the loser's parts are aborted
    assert not s3.list_multipart_uploads(Bucket=BUCKET, Prefix=target.key).get("Uploads")


def test_a_failed_multipart_upload_is_aborted_and_leaves_nothing(s3_env, s3, monkeypatch):
    relay = S3Relay(s3_env)
    relay.fail(lambda method, path: method == "PUT" and "partNumber=2" in path, status=403)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    store = OutputStore(Settings(ce_output_part_size_mib=5))
    target = parse_output_uri(fresh_output("pcm"))
    calls: list[int] = []

    try:
        with pytest.raises(OutputError) as raised:
            asyncio.run(
                store.complete(target, "a" * 64, "d", lambda: _produce_once(_audio(11 * 2**20), calls))
            )
    finally:
        relay.close()

    assert raised.value.http_status == 502 and "AccessDenied" in raised.value.message
    assert calls == [1]
    parts = [(s.path.rsplit("partNumber=", 1)[1], s.spoiled) for s in relay.requests("PUT", "partNumber=")]
    assert parts == [("1", False), ("2", True)]  # the upload stopped at the failed part
    assert len(relay.requests("DELETE", "uploadId=")) == 1
    assert not s3.list_multipart_uploads(Bucket=BUCKET, Prefix=target.key).get("Uploads")
    assert versions(s3, target.uri) == []


def _completions(relay: S3Relay) -> list[Seen]:
    return relay.requests("POST", "uploadId=")


def test_an_upload_that_failed_is_aborted_before_the_error_so_its_late_completion_cannot_land(
    s3_env, s3, monkeypatch
):
    # The completion is lost on its way (the upstream never sees it), as on a link that stalls; what
    # must not happen is that it arrives after the event was answered with an error and lands there.
    relay = S3Relay(s3_env)
    relay.fail(lambda method, path: method == "POST" and "uploadId=" in path, status=500)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    store = OutputStore(Settings())
    target = parse_output_uri(fresh_output("pcm"))
    audio = _audio(4096)

    try:
        with pytest.raises(OutputError):
            asyncio.run(store.complete(target, "l" * 64, "d", lambda: _produce_once(audio, [])))
    finally:
        relay.close()

    (completion,) = _completions(relay)
    upload_id = completion.path.split("uploadId=", 1)[1].split("&", 1)[0]
    assert len(relay.requests("DELETE", f"uploadId={upload_id}")) == 1  # aborted before the reply
    # The same completion arriving late: S3 refuses it, so the error the caller got stays true.
    etag = '"' + hashlib.md5(audio.data).hexdigest() + '"'
    with pytest.raises(ClientError) as late:
        s3.complete_multipart_upload(
            Bucket=BUCKET,
            Key=target.key,
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"ETag": etag, "PartNumber": 1}]},
        )
    # S3 answers NoSuchUpload; moto's KeyError on the aborted upload comes back as a bare 500.
    assert late.value.response["Error"]["Code"] in ("NoSuchUpload", "500")
    assert versions(s3, target.uri) == []


def test_an_output_whose_completion_landed_though_its_answer_was_lost_is_written_once(
    s3_env, s3, monkeypatch
):
    relay = S3Relay(s3_env)
    relay.fail(lambda method, path: method == "POST" and "uploadId=" in path, status=500, applied=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    store = OutputStore(Settings())
    target = parse_output_uri(fresh_output("pcm"))
    audio = _audio(4096)
    calls: list[int] = []

    try:
        completion = asyncio.run(store.complete(target, "w" * 64, "d", lambda: _produce_once(audio, calls)))
    finally:
        relay.close()

    # The abort found the upload completed, the object held this event's audio: a success, not a retry.
    assert completion.data["sha256"] == audio.sha256 and calls == [1]
    assert len(_completions(relay)) == 1 and len(relay.requests("DELETE", "uploadId=")) == 1
    assert len(versions(s3, target.uri)) == 1
    assert hashlib.sha256(download(s3, target.uri)).hexdigest() == audio.sha256
    record = s3.get_object(Bucket=BUCKET, Key=target.record_key("w" * 64))["Body"].read()
    assert json.loads(record)["reply"]["sha256"] == audio.sha256
