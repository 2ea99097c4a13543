"""Shadow traffic through real components: the S3 sink against moto, request ids and the revision
on a real predictor's responses, its directory, stdout and S3 sinks (batches, and the tail on
SIGTERM), then a real Envoy, programmed as Istio would be for our VirtualService (tts_ops.mirroring),
mirroring real requests to a stable and three canaries judged by `tts-ops compare`, and mirroring the
shipped share of them.

The fingerprint, the recorder in-process and compare on synthetic files: tests/unit/test_shadow_records.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import threading
import uuid
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

# Triton's copy of the v2 protos, as the other test modules load: KServe's and Triton's define the same
# `inference.*` symbols and cannot share one process.
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as grpc_predict_v2_pb2_grpc

from predictor.audio import fingerprint
from predictor.observability import metrics
from predictor.shadow import recorder as recording
from testing import binomial, envoy
from testing.bodies import v1_request, v2_grpc_request, v2_request
from testing.polling import wait_until
from testing.ports import free_port
from testing.predictor import run_cli
from testing.s3 import aws_env, s3_client
from testing.s3_relay import S3Relay
from tts_ops import compare, manifests, mirroring

SHADOW_BUCKET = "shadow-sink-retries"


@pytest.fixture
def shadow_relay(s3_env, monkeypatch):
    """A relay in front of moto that the S3 sink writes through (it can fail the sink's PUTs)."""
    from testing.s3 import s3_client

    s3_client(s3_env).create_bucket(Bucket=SHADOW_BUCKET)
    relay = S3Relay(s3_env)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    yield relay
    relay.close()


def _write_one_batch_through(relay, prefix: str, records: int) -> dict[str, float]:
    """Records through a Recorder into the S3 sink at ``prefix``; the written/lost counter increments."""
    from predictor.shadow.sinks import S3Sink

    counters = {o: metrics.SHADOW_RECORDS.labels(o) for o in ("written", "lost")}
    before = {o: c._value.get() for o, c in counters.items()}
    recorder = recording.Recorder(
        S3Sink(SHADOW_BUCKET, prefix, "rev"),
        "rev",
        batch_records=records,
        flush_s=60,
        queue_size=10,
        backoff_s=0.01,
    )
    for i in range(records):
        recorder.submit(f"id{i}", "/v2/models/{model_name}/infer", 200, 0.1, None)
    recorder.close()
    return {o: c._value.get() - before[o] for o, c in counters.items()}


def test_s3_sink_retries_a_failed_batch_and_writes_it_once(shadow_relay, s3_env):
    from testing.s3 import s3_client

    shadow_relay.fail(lambda method, path: method == "PUT" and "/retried/" in path, status=500, times=2)

    moved = _write_one_batch_through(shadow_relay, "retried", records=3)

    puts = shadow_relay.requests("PUT", "/retried/")
    assert [p.spoiled for p in puts] == [True, True, False]  # two failures, then the write
    assert moved == {"written": 3, "lost": 0}
    client = s3_client(s3_env)
    (stored,) = client.list_objects_v2(Bucket=SHADOW_BUCKET, Prefix="retried/")["Contents"]
    body = client.get_object(Bucket=SHADOW_BUCKET, Key=stored["Key"])["Body"].read()
    assert [json.loads(line)["id"] for line in body.splitlines()] == ["id0", "id1", "id2"]


def test_s3_sink_that_keeps_failing_counts_the_batch_lost_after_three_retries(shadow_relay, s3_env):
    from testing.s3 import s3_client

    shadow_relay.fail(lambda method, path: method == "PUT" and "/lost/" in path, status=503)

    moved = _write_one_batch_through(shadow_relay, "lost", records=4)

    assert len(shadow_relay.requests("PUT", "/lost/")) == 4  # the first try and three retries
    assert moved == {"written": 0, "lost": 4}
    assert "Contents" not in s3_client(s3_env).list_objects_v2(Bucket=SHADOW_BUCKET, Prefix="lost/")


def _dir_records(directory: Path) -> dict[str, dict]:
    records = {}
    for path in directory.glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            record = json.loads(line)
            records[record["id"]] = record
    return records


def test_directory_sink_writes_whole_batches_named_by_time_and_revision(plain_predictor):
    ids = [f"dir-{uuid.uuid4().hex[:8]}" for _ in range(2)]

    for request_id in ids:
        r = plain_predictor.post(
            "/v2/models/tts/infer",
            json=v2_request("Into the directory."),
            headers={"x-request-id": request_id},
        )
        assert r.status_code == 200
    records = wait_until(
        lambda: (found := _dir_records(plain_predictor.shadow_dir)) and set(ids) <= set(found) and found,
        30,
        0.1,
        "both records in the directory",
    )

    assert all(records[i]["revision"] == "rev-dir" and records[i]["status"] == 200 for i in ids)
    names = [p.name for p in plain_predictor.shadow_dir.iterdir()]
    assert names and all(
        re.fullmatch(r"\d{8}T\d{6}\.\d{6}Z-rev-dir-[0-9a-f]{12}\.jsonl", n) for n in names
    ), names


BAD_IDS = {
    "longer than 200 characters": "x" * 201,
    "not ASCII": "caf\u00e9-42".encode(),
    "with a space": "two words",
}


@pytest.mark.parametrize("incoming", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_a_bad_incoming_request_id_is_replaced_by_a_fresh_uuid4_in_header_and_record(
    plain_predictor, incoming
):
    r = plain_predictor.post(
        "/v2/models/tts/infer", json=v2_request("Clean my id."), headers={"x-request-id": incoming}
    )

    assert r.status_code == 200
    fresh = r.headers["x-request-id"]
    assert uuid.UUID(fresh).version == 4
    record = wait_until(lambda: _dir_records(plain_predictor.shadow_dir).get(fresh), 30, 0.1, "the record")
    assert record["status"] == 200
    sent = incoming.decode() if isinstance(incoming, bytes) else incoming
    assert sent not in plain_predictor.logs(), "the bad id reached the log"


def test_a_bad_request_id_over_grpc_is_replaced_too(plain_predictor):
    with grpc.insecure_channel(plain_predictor.grpc) as channel:
        stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ServerLive.with_call(
            pb.ServerLiveRequest(), metadata=(("x-request-id", "y" * 201),), timeout=10
        )

    assert uuid.UUID(dict(call.initial_metadata())["x-request-id"]).version == 4


# --- a real predictor: headers, stdout sink, S3 sink ------------------------------------------
@pytest.fixture(scope="module")
def stdout_predictor(start_predictor):
    return start_predictor(SHADOW_SINK="stdout", REVISION="rev-stdout", SHADOW_FLUSH_S="0.2")


def _records_in(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith('{"v":1,'):
            out.append(json.loads(line))
    return out


def test_response_echoes_the_callers_request_id_and_names_the_revision(stdout_predictor):
    r = stdout_predictor.post(
        "/v2/models/tts/infer", json=v2_request("Echo my id."), headers={"X-Request-Id": "abc-123"}
    )

    assert r.status_code == 200
    assert r.headers["x-request-id"] == "abc-123"
    assert r.headers["x-tts-revision"] == "rev-stdout"


def test_request_id_is_generated_when_absent_on_every_route(stdout_predictor):
    first = stdout_predictor.get("/v2/health/live")
    second = stdout_predictor.get("/v2/health/live")
    missing = stdout_predictor.get("/no/such/route")

    ids = [uuid.UUID(r.headers["x-request-id"]) for r in (first, second, missing)]
    assert all(i.version == 4 for i in ids) and len(set(ids)) == 3
    assert missing.status_code == 404 and missing.headers["x-tts-revision"] == "rev-stdout"


def test_grpc_call_carries_the_request_id_and_revision_in_initial_metadata(stdout_predictor):
    with grpc.insecure_channel(stdout_predictor.grpc) as channel:
        stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ServerLive.with_call(
            pb.ServerLiveRequest(), metadata=(("x-request-id", "grpc-42"),), timeout=10
        )

    metadata = dict(call.initial_metadata())
    assert metadata["x-request-id"] == "grpc-42" and metadata["x-tts-revision"] == "rev-stdout"


def test_stdout_sink_prints_one_record_per_synthesis_request_errors_included(stdout_predictor):
    ok_id, bad_id, probe_id = (f"stdout-{uuid.uuid4().hex[:8]}" for _ in range(3))
    stdout_predictor.post(
        "/v1/models/tts:predict",
        json={"instances": [{"text": "Keep a record."}]},
        headers={"X-Request-Id": ok_id},
    )
    stdout_predictor.post("/v2/models/tts/infer", json=v2_request(" "), headers={"X-Request-Id": bad_id})
    httpx.get(stdout_predictor.url + "/v2/health/live", headers={"X-Request-Id": probe_id}, timeout=5)

    by_id = _wait_for_records(stdout_predictor, ok_id, bad_id)
    ok, bad = by_id[ok_id], by_id[bad_id]
    assert (
        ok["status"] == 200
        and ok["route"] == "/v1/models/{model_name}:predict"
        and ok["revision"] == "rev-stdout"
    )
    assert (
        ok["audio_s"] > 0.5
        and ok["sample_rate"] == 22050
        and ok["text_sha256"] == recording.text_sha256(["Keep a record."])
    )
    assert np.asarray(ok["mcep"]).shape == (fingerprint.FRAMES, fingerprint.N_CEPS)
    assert "Keep a record" not in json.dumps(ok), "the text itself must not leave the pod"
    assert bad["status"] == 400 and bad["mcep"] is None
    assert probe_id not in by_id, "probes are not synthesis requests"


def _wait_for_records(p, *ids: str, timeout_s: float = 20) -> dict[str, dict]:
    """The records in ``p``'s log by id, once all of ``ids`` are there (or whatever is after the timeout)."""

    def found() -> dict[str, dict]:
        by_id = {r["id"]: r for r in _records_in(p.logs())}
        return by_id if all(i in by_id for i in ids) else {}

    try:
        return p.wait_for(found, timeout_s, f"records {ids}", interval=0.1)
    except TimeoutError:
        return {r["id"]: r for r in _records_in(p.logs())}


def test_grpc_model_infer_leaves_a_record_under_the_callers_id(stdout_predictor):
    request = v2_grpc_request("Over gRPC.")
    with grpc.insecure_channel(stdout_predictor.grpc) as channel:
        stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(request, metadata=(("x-request-id", "grpc-infer-1"),), timeout=60)

    got = _wait_for_records(stdout_predictor, "grpc-infer-1")["grpc-infer-1"]

    assert got["route"] == "grpc:ModelInfer" and got["status"] == 200 and got["audio_s"] > 0.3
    assert got["text_sha256"] == recording.text_sha256(["Over gRPC."])


def test_each_request_on_a_model_stream_infer_stream_leaves_a_record_of_its_own(stdout_predictor):
    import tritonclient.grpc as triton_grpc

    answers: list = []
    client = triton_grpc.InferenceServerClient(stdout_predictor.grpc)
    client.start_stream(
        callback=lambda result, error: answers.append(error or result), headers={"x-request-id": "stream-1"}
    )
    for request_id, text in (("first", "Streamed once."), ("", "Streamed twice, longer.")):
        inp = triton_grpc.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([text.encode()], dtype=object))
        client.async_stream_infer("tts", [inp], request_id=request_id)
    client.stop_stream()

    got = _wait_for_records(stdout_predictor, "stream-1/first", "stream-1/1")

    assert answers and not any(isinstance(a, Exception) for a in answers), answers[:1]
    first, second = got["stream-1/first"], got["stream-1/1"]
    assert first["route"] == second["route"] == "grpc:ModelStreamInfer"
    assert first["status"] == second["status"] == 200
    assert first["text_sha256"] == recording.text_sha256(["Streamed once."])
    assert second["text_sha256"] == recording.text_sha256(["Streamed twice, longer."])
    assert second["audio_s"] > first["audio_s"] > 0.5


def test_speech_route_record_covers_every_segment_streamed_or_not(stdout_predictor):
    body = {"model": "tts", "input": "First sentence here. And a second one.", "response_format": "pcm"}
    whole = stdout_predictor.post("/v1/audio/speech", json=body, headers={"X-Request-Id": "speech-1"})
    streamed = stdout_predictor.post(
        "/v1/audio/speech", json={**body, "stream": True}, headers={"X-Request-Id": "speech-2"}
    )

    got = _wait_for_records(stdout_predictor, "speech-1", "speech-2")

    assert whole.status_code == streamed.status_code == 200
    for rid, response in (("speech-1", whole), ("speech-2", streamed)):
        record = got[rid]
        assert record["route"] == "/v1/audio/speech" and record["items"] == 2
        assert record["text_sha256"] == recording.text_sha256(["First sentence here.", "And a second one."])
        assert np.asarray(record["mcep"]).shape == (fingerprint.FRAMES, fingerprint.N_CEPS)
        # Segments are recorded as synthesized, before the crossfade shortens each join a little.
        assert record["audio_s"] == pytest.approx(len(response.content) / 2 / 22050, abs=0.2)


def _objects(client, bucket: str, prefix: str) -> list[list[dict]]:
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    bodies = [
        client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        for o in sorted(listing, key=lambda o: o["Key"])
    ]
    return [[json.loads(line) for line in body.splitlines()] for body in bodies]


def test_s3_sink_writes_batches_and_the_tail_on_sigterm(start_predictor, s3_server):
    client = s3_client(s3_server)
    client.create_bucket(Bucket="shadow-batches")
    prefix = f"run-{uuid.uuid4().hex[:8]}"
    p = start_predictor(
        SHADOW_SINK=f"s3://shadow-batches/{prefix}",
        REVISION="rev-s3",
        SHADOW_BATCH_RECORDS="3",
        SHADOW_FLUSH_S="3600",
    )
    sent = [f"s3-{i}" for i in range(7)]
    for i, rid in enumerate(sent):
        body = v2_request(f"Batch record number {i}.") if i != 6 else v2_request("")
        p.post("/v2/models/tts/infer", json=body, headers={"X-Request-Id": rid})

    with contextlib.suppress(TimeoutError):  # the assertion on before_stop says what went missing
        p.wait_for(lambda: len(_objects(client, "shadow-batches", prefix)) >= 2, 30, "two batches", 0.2)
    before_stop = _objects(client, "shadow-batches", prefix)
    dropped = p.metric("tts_shadow_records_total", outcome="dropped")
    code = p.stop()
    after_stop = _objects(client, "shadow-batches", prefix)

    assert [len(b) for b in before_stop] == [3, 3], "two full batches, the seventh record still waiting"
    assert code == 0
    assert sorted(len(b) for b in after_stop) == [1, 3, 3]
    records = {r["id"]: r for batch in after_stop for r in batch}
    assert sorted(records) == sorted(sent)
    assert records["s3-6"]["status"] == 400
    assert records["s3-2"]["text_sha256"] == recording.text_sha256(["Batch record number 2."])
    assert {r["revision"] for r in records.values()} == {"rev-s3"}
    assert dropped == 0


# --- end to end: Envoy mirroring to three canaries --------------------------------------------
class SlowProxy:
    """TCP proxy that forwards each request's headers at once and its body `delay_s` later.

    The predictor's clock starts when the headers arrive, so the delay lands in the latency the
    canary records, as a canary slow to answer would. It delays the first request of a connection
    only, so Envoy is told to open one connection per request to it (`one_request_per_connection`).
    """

    def __init__(self, upstream_port: int, delay_s: float):
        self.upstream_port, self.delay_s = upstream_port, delay_s
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        start = asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(start, self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            head = b""
            while b"\r\n\r\n" not in head and (chunk := await reader.read(65536)):
                head += chunk
            split = head.find(b"\r\n\r\n") + 4
            up_writer.write(head[:split])
            await up_writer.drain()
            await asyncio.sleep(self.delay_s)
            up_writer.write(head[split:])
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            dst.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)


def one_request_per_connection(config: dict, cluster: str) -> None:
    """Envoy closes its upstream connection to ``cluster`` after each request (SlowProxy needs it)."""
    (found,) = [c for c in config["static_resources"]["clusters"] if c["name"] == cluster]
    found["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": {"max_requests_per_connection": 1},
            "explicit_http_config": {"http_protocol_options": {}},
        }
    }


def shipped_virtual_service(overlay: str = "knative/overlays/cpu") -> dict:
    (found,) = [o for o in manifests.render_all()[overlay] if o["kind"] == "VirtualService"]
    return found


MIRROR_TEXTS = [
    "The canary should sound like stable.",
    "Short one.",
    "Shadow traffic never reaches a user.",
    "Numbers like seven are read aloud.",
    "A second sentence follows the first. Then a third.",
]
N_MIRRORED = 20
SLOW_S = 3.0
SYNTH_ROUTES = ("/v2/models/{model_name}/infer", "/v1/models/{model_name}:predict")
# Four predictors and Envoy share CI's two CPUs, so stable's and an identical canary's latencies
# differ by chance far more than in a real cluster; a 3 s delay still clears these by far.
LOOSE_LATENCY = ("--max-p50-increase", "1.0", "--max-p99-increase", "3.0")
CANARIES = ("same", "slower-speech", "slow")


def synth_requests(p) -> float:
    return sum(p.metric("tts_requests_total", route=r, code="200") for r in SYNTH_ROUTES)


@pytest.fixture(scope="module")
def mirrored(start_predictor, s3_server, tmp_path_factory):
    """N requests through Envoy to stable, mirrored to an identical canary, one speaking slower
    (DEFAULT_LENGTH_SCALE) and one behind a slow link; every predictor stopped, records flushed.

    The route is the shipped VirtualService's, patched as a test environment would patch it: its one
    10 % mirror replaced by `mirrors:`, the three canaries at 100 % each."""
    client = s3_client(s3_server)
    client.create_bucket(Bucket="shadow-e2e")
    run = uuid.uuid4().hex[:8]
    uris = {name: f"s3://shadow-e2e/{run}/{name}" for name in ("stable", *CANARIES)}
    extra = {"slower-speech": {"DEFAULT_LENGTH_SCALE": "1.3"}}
    predictors = {
        name: start_predictor(
            wait=False, SHADOW_SINK=uri, SHADOW_FLUSH_S="1", REVISION=name, **extra.get(name, {})
        )
        for name, uri in uris.items()
    }
    for p in predictors.values():
        p.wait_ready()
    proxy = SlowProxy(predictors["slow"].http_port, SLOW_S)
    service = shipped_virtual_service()
    rule = service["spec"]["http"][0]
    del rule["mirror"], rule["mirrorPercentage"]
    hosts = {name: f"tts-canary-{name}.tts.svc.cluster.local" for name in CANARIES}
    rule["mirrors"] = [
        {"destination": {"host": host, "port": {"number": 80}}, "percentage": {"value": 100.0}}
        for host in hosts.values()
    ]
    upstreams = {
        mirroring.route_destination(service).host: predictors["stable"].url,
        hosts["same"]: predictors["same"].url,
        hosts["slower-speech"]: predictors["slower-speech"].url,
        hosts["slow"]: proxy.url,
    }
    port = free_port()
    config = mirroring.bootstrap(service, upstreams, port, free_port())
    one_request_per_connection(config, mirroring.Destination(hosts["slow"], 80).cluster)
    base = f"http://127.0.0.1:{port}"
    try:
        with envoy.running(config, tmp_path_factory.mktemp("envoy")):
            sent, answered = [], []
            for i in range(N_MIRRORED):
                text = MIRROR_TEXTS[i % len(MIRROR_TEXTS)]
                # A seed makes both revisions' noise the same, so an identical canary's audio is identical.
                if i % 2:
                    path, body = "/v2/models/tts/infer", v2_request(text, seed=i)
                else:
                    path, body = "/v1/models/tts:predict", v1_request(text, seed=i)
                headers = {"X-Request-Id": f"client-{run}-{i}"} if i % 3 == 0 else {}
                r = httpx.post(base + path, json=body, headers=headers, timeout=120)
                assert r.status_code == 200, r.text
                sent.append(headers.get("X-Request-Id"))
                answered.append(r.headers["x-request-id"])
                # The next request once the canaries beside the stable have answered this one: sent when
                # the stable alone had, it queued behind their earlier ones on these shared CPUs, and the
                # queue counted in their latency (an identical canary's p50 1,629 ms against the stable's
                # 724 in one run). The slow one's requests arrive SLOW_S later whatever the pace.
                for name in ("same", "slower-speech"):
                    p = predictors[name]
                    p.wait_for(
                        lambda p=p, n=i + 1: synth_requests(p) >= n, 60, "the mirrored request answered", 0.02
                    )
            # Mirrored requests finish after the client's answers; wait for each canary to have all of them.
            for name in CANARIES:
                p = predictors[name]
                p.wait_for(
                    lambda p=p: synth_requests(p) >= N_MIRRORED, 60, "every mirrored request answered", 0.2
                )
    finally:
        proxy.close()
        codes = {name: p.stop() for name, p in predictors.items()}
    assert codes == dict.fromkeys(uris, 0)
    return {"uris": uris, "sent": sent, "answered": answered, "env": aws_env(s3_server)}


def test_request_ids_propagate_through_the_mirror_to_every_predictor(mirrored, s3_env):
    ids = {name: sorted(r["id"] for r in compare.load_records(uri)) for name, uri in mirrored["uris"].items()}

    given = [(s, a) for s, a in zip(mirrored["sent"], mirrored["answered"], strict=True) if s]
    assert given and all(s == a for s, a in given), "the client's own ids come back"
    assert len(set(mirrored["answered"])) == N_MIRRORED, "Envoy generated a distinct id for the rest"
    assert all(got == sorted(mirrored["answered"]) for got in ids.values()), ids


def compare_with_stable(mirrored, canary: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`tts-ops compare` of one canary's records against the stable's, latency limits loosened."""
    uris = mirrored["uris"]
    return run_cli(
        "compare",
        "--stable",
        uris["stable"],
        "--canary",
        uris[canary],
        *LOOSE_LATENCY,
        *args,
        env=mirrored["env"],
        module="tts_ops",
    )


def test_identical_canary_passes(mirrored):
    run = compare_with_stable(mirrored, "same")

    assert run.returncode == 0, run.stdout + run.stderr
    assert "match rate       100.0%" in run.stdout and "p50 0.00 dB" in run.stdout


def test_canary_with_other_synthesis_settings_fails_naming_duration(mirrored):
    run = compare_with_stable(mirrored, "slower-speech", "--json")

    assert run.returncode == 1, run.stdout + run.stderr
    summary = json.loads(run.stdout)
    assert 1.1 < summary["duration_ratio"] < 1.35  # length_scale 1.3 stretches speech, not the edges
    assert any(r.startswith("duration ratio") for r in summary["reasons"]), summary["reasons"]


def test_canary_with_injected_latency_fails_naming_latency(mirrored, tmp_path):
    png = tmp_path / "slow.png"
    run = compare_with_stable(mirrored, "slow", "--png", str(png))

    reasons = run.stdout.split("FAIL", 1)[-1]
    assert run.returncode == 1, run.stdout + run.stderr
    assert "latency p50" in reasons
    assert "duration" not in reasons and "spectral" not in reasons
    assert png.read_bytes()[:4] == b"\x89PNG"


N_SHARE = 240


def test_envoy_mirrors_the_shipped_share_of_requests_to_the_canary(start_predictor, tmp_path):
    # The shipped rule unchanged: Envoy samples each request independently, so the canary's count is
    # binomial. A share translated per hundred instead of per million (or not at all) lands far outside.
    service = shipped_virtual_service()
    (mirror,) = mirroring.mirrors(service)
    stable, canary = start_predictor(wait=False, ENGINE="auto"), start_predictor(wait=False, ENGINE="auto")
    stable.wait_ready()
    canary.wait_ready()
    upstreams = {mirroring.route_destination(service).host: stable.url, mirror.destination.host: canary.url}
    port = free_port()
    with envoy.running(
        mirroring.bootstrap(service, upstreams, port, free_port()), tmp_path / "envoy"
    ) as admin:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            codes = [
                client.post("/v2/models/tts/infer", json=v2_request("Hi.")).status_code
                for _ in range(N_SHARE)
            ]
        assert codes == [200] * N_SHARE
        # Mirrors are fire-and-forget: the last ones may still be running when stable has answered.
        stat = f"cluster.{mirror.destination.cluster}.upstream_rq_"
        canary.wait_for(
            lambda: envoy.stats(admin)[stat + "active"] == 0, 30, "no mirrored request in flight", 0.2
        )
        copies = envoy.stats(admin)[stat + "completed"]

    low, high = binomial.count_range(N_SHARE, mirror.percent / 100)
    assert synth_requests(stable) == N_SHARE
    assert synth_requests(canary) == copies, "every mirrored request reached the canary and was answered"
    assert low <= copies <= high, (copies, (low, high), mirror.percent)
