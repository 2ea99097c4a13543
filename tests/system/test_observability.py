"""Metrics exist and move with traffic; spans reach an OTLP receiver; logs are JSON lines."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from testing.bodies import v2_request
from testing.ports import free_port
from testing.s3 import SECRET

INFER = "/v2/models/{model_name}/infer"


def test_cold_start_phases_are_exported(predictor):
    phases = {
        p: predictor.metric("tts_cold_start_seconds", phase=p) for p in ("fetch", "load", "warmup", "total")
    }

    assert all(v > 0 for v in phases.values()), phases
    assert phases["total"] >= phases["warmup"]
    assert predictor.metric("tts_fetch_bytes_total") > 60_000_000
    assert predictor.metric("tts_model_ready") == 1


def test_request_metrics_move_with_traffic(predictor):
    before = {
        "ok": predictor.metric("tts_requests_total", route=INFER, code="200"),
        "bad": predictor.metric("tts_request_errors_total", route=INFER, code="400"),
        "synth": predictor.metric("tts_synthesis_seconds_count"),
        "audio": predictor.metric("tts_audio_seconds_sum"),
        "rtf": predictor.metric("tts_real_time_factor_count"),
        "grpc": predictor.metric("tts_requests_total", route="grpc:ModelInfer", code="OK"),
    }

    predictor.post("/v2/models/tts/infer", json=v2_request("Counting requests."))
    predictor.post("/v2/models/tts/infer", json=v2_request(""))
    client = triton_grpc.InferenceServerClient(predictor.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"And over gRPC."], dtype=object))
    client.infer("tts", [text])

    assert predictor.metric("tts_requests_total", route=INFER, code="200") == before["ok"] + 1
    assert predictor.metric("tts_request_errors_total", route=INFER, code="400") == before["bad"] + 1
    assert predictor.metric("tts_synthesis_seconds_count") == before["synth"] + 2
    assert predictor.metric("tts_audio_seconds_sum") > before["audio"] + 1.0
    assert predictor.metric("tts_real_time_factor_count") == before["rtf"] + 2
    assert predictor.metric("tts_requests_total", route="grpc:ModelInfer", code="OK") == before["grpc"] + 1
    assert predictor.metric("tts_in_flight_requests") == 0 and predictor.metric("tts_queue_depth") == 0


def test_logs_are_json_lines(predictor):
    lines = [line for line in predictor.logs().splitlines() if line.startswith("{")]

    records = [json.loads(line) for line in lines]

    ready = [r for r in records if r["msg"] == "model ready"]
    assert (
        len(ready) == 1
        and ready[0]["cold_start_s"] > 0
        and set(ready[0]["phases_s"]) == {"fetch", "load", "warmup"}
    )


def test_log_format_text_writes_plain_lines_with_the_fields_as_key_value(plain_predictor):
    lines = [line for line in plain_predictor.logs().splitlines() if line.strip()]

    ready = [line for line in lines if "model ready" in line]
    assert len(ready) == 1 and "cold_start_s=" in ready[0] and " INFO " in ready[0]
    assert not any(line.lstrip().startswith("{") for line in lines), "a JSON line in text mode"


class _Collector(BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self):
        length = int(self.headers["content-length"])
        type(self).bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def otlp_receiver():
    _Collector.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Collector.bodies
    server.shutdown()


def test_spans_reach_an_otlp_receiver(start_predictor, otlp_receiver):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    endpoint, bodies = otlp_receiver
    predictor = start_predictor(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    predictor.post("/v2/models/tts/infer", json=v2_request("Traced."))

    assert predictor.stop() == 0  # shutdown flushes the batch processor

    spans = []
    for body in bodies:
        request = ExportTraceServiceRequest.FromString(body)
        spans += [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    names = {s.name for s in spans}
    assert {"cold_start", "fetch", "load", "warmup", "synthesize"} <= names
    by_name = {s.name: s for s in spans}
    assert by_name["fetch"].parent_span_id == by_name["cold_start"].span_id
    assert all(SECRET.encode() not in body for body in bodies)
