"""What one request may cost, over real sockets to real predictors: work bounded before any synthesis
(MAX_ENGINE_CALLS, MAX_REQUEST_AUDIO_S) on every route, work stopped when the caller leaves, and an
event loop that answers probes while the largest bodies are decoded."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from testing.bodies import cloudevent_headers, v2_request
from testing.polling import wait_until
from testing.predictor import PredictorProcess

SENTENCE = "The quick brown fox jumps over the lazy dog."
MAX_ENGINE_CALLS = 5
PROBE_TIMEOUT_S = 1.0  # Kubernetes' default timeoutSeconds, which the manifests keep
MAX_REQUEST_AUDIO_S = 60.0
# 700 characters may make up to 70 s of audio (0.1 s per character): over MAX_REQUEST_AUDIO_S.
LONG_TEXT = ("word " * 140).strip() + "."


@pytest.fixture(scope="module")
def bounded(start_predictor) -> PredictorProcess:
    return start_predictor(
        ENGINE="onnx",
        MAX_ENGINE_CALLS=str(MAX_ENGINE_CALLS),
        MAX_REQUEST_AUDIO_S=str(MAX_REQUEST_AUDIO_S),
    )


def _engine_calls(p: PredictorProcess) -> float:
    return p.metric("tts_batch_size_count")


def _grpc_infer(p: PredictorProcess, text: str) -> None:
    client = triton_grpc.InferenceServerClient(p.grpc)
    inp = triton_grpc.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=object))
    client.infer("tts", [inp])


def _grpc_stream(p: PredictorProcess, text: str) -> list:
    client = triton_grpc.InferenceServerClient(p.grpc)
    results: list = []
    client.start_stream(callback=lambda result, error: results.append(error or result))
    inp = triton_grpc.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=object))
    client.async_stream_infer("tts", [inp])
    client.stop_stream()
    return results


ROUTES = {
    "v2 REST": lambda p, t: p.post("/v2/models/tts/infer", json=v2_request(t)),
    "v1": lambda p, t: p.post("/v1/models/tts:predict", json={"instances": [{"text": t}]}),
    "speech": lambda p, t: p.post(
        "/v1/audio/speech", json={"model": "tts", "input": t, "response_format": "wav"}
    ),
    "event": lambda p, t: p.post(
        "/v1/models/tts:predict",
        headers=cloudevent_headers(f"cost-{time.monotonic_ns()}"),
        content=json.dumps({"text": t}),
    ),
}


@pytest.mark.parametrize("route", ROUTES.values(), ids=ROUTES.keys())
def test_a_request_for_more_audio_than_max_request_audio_s_is_413_before_any_synthesis(bounded, route):
    before = _engine_calls(bounded)

    response = route(bounded, LONG_TEXT)

    assert response.status_code == 413, response.text
    assert "MAX_REQUEST_AUDIO_S=60" in response.json()["error"]
    assert _engine_calls(bounded) == before


def test_grpc_requests_for_more_audio_than_max_request_audio_s_are_refused_before_any_synthesis(bounded):
    before = _engine_calls(bounded)

    with pytest.raises(InferenceServerException) as unary:
        _grpc_infer(bounded, LONG_TEXT)
    (streamed,) = _grpc_stream(bounded, LONG_TEXT)

    assert "MAX_REQUEST_AUDIO_S=60" in unary.value.message()
    assert "MAX_REQUEST_AUDIO_S=60" in str(streamed)
    assert _engine_calls(bounded) == before


def test_a_speech_input_of_more_segments_than_max_engine_calls_is_413_before_any_synthesis(bounded):
    before = _engine_calls(bounded)
    at_limit = " ".join(["Hi."] * MAX_ENGINE_CALLS)
    over = " ".join(["Hi."] * (MAX_ENGINE_CALLS + 1))

    refused = bounded.post("/v1/audio/speech", json={"model": "tts", "input": over, "response_format": "wav"})
    calls_refused = _engine_calls(bounded) - before
    served = bounded.post(
        "/v1/audio/speech", json={"model": "tts", "input": at_limit, "response_format": "wav"}
    )

    assert refused.status_code == 413, refused.text
    assert "6 engine calls" in refused.json()["error"] and "MAX_ENGINE_CALLS=5" in refused.json()["error"]
    assert calls_refused == 0
    assert served.status_code == 200, served.text
    assert _engine_calls(bounded) - before == MAX_ENGINE_CALLS


def _probe_seconds(p: PredictorProcess, until: float) -> list[float]:
    seconds = []
    while time.monotonic() < until:
        started = time.monotonic()
        assert p.get("/v2/health/live", timeout=5).status_code == 200
        seconds.append(time.monotonic() - started)
        time.sleep(0.02)
    return sorted(seconds)


def _p99(sorted_seconds: list[float]) -> float:
    return sorted_seconds[int(len(sorted_seconds) * 0.99)]


def test_liveness_answers_within_the_probe_timeout_while_the_largest_bodies_are_decoded_over_rest_and_grpc(
    bounded,
):
    # The bodies issue 25 found holding the loop for seconds: one text of about four million
    # characters (refused for MAX_TEXT_CHARS), and the most texts the limits admit, each at the
    # longest MAX_TEXT_CHARS allows, normalized and then refused for their audio. Encoded once, so the
    # senders spend their time on the wire, not on this process's GIL beside the probes.
    huge = "a " * 1_900_000
    bodies = [json.dumps(v2_request(huge)).encode(), json.dumps(v2_request(*(["word " * 400] * 64))).encode()]
    stop = threading.Event()
    errors: list[str] = []

    def load(send) -> None:
        while not stop.is_set():
            try:
                send()
            except InferenceServerException:
                pass  # the refusal itself
            except Exception as exc:
                errors.append(repr(exc))

    def post(body: bytes):
        return lambda: bounded.post(
            "/v2/models/tts/infer", content=body, headers={"content-type": "application/json"}
        )

    idle = _probe_seconds(bounded, time.monotonic() + 3)
    threads = [
        threading.Thread(target=load, args=(s,))
        for s in (*map(post, bodies), lambda: _grpc_infer(bounded, huge))
    ]
    for t in threads:
        t.start()
    try:
        loaded = _probe_seconds(bounded, time.monotonic() + 15)
    finally:
        stop.set()
        for t in threads:
            t.join(120)

    assert not errors, errors[:3]
    # What must hold: no probe waits out the kubelet's default timeout (1 s; the manifests keep it),
    # where one such body used to hold the loop for 3.7 s. The 100 ms is not met yet: 4 MB
    # bodies are still read through h11 on the loop (docs/benchmarks.md, the attacks table).
    bound = max(PROBE_TIMEOUT_S, 2 * _p99(idle))
    assert _p99(loaded) < bound, f"p99 {_p99(loaded):.3f} s under load, idle p99 {_p99(idle):.3f} s"


def _raw_request(p: PredictorProcess, path: str, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", p.http_port), timeout=30)
    s.sendall(
        f"POST {path} HTTP/1.1\r\nHost: predictor\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return s


def test_a_speech_request_whose_client_hangs_up_stops_at_the_next_segment_and_counts_as_499(predictor):
    route = "/v1/audio/speech"
    before = {
        "calls": _engine_calls(predictor),
        "ok": predictor.metric("tts_requests_total", route=route, code="200"),
        "gone": predictor.metric("tts_requests_total", route=route, code="499"),
    }
    six = " ".join([SENTENCE] * 6)

    s = _raw_request(predictor, route, {"model": "tts", "input": six, "response_format": "wav"})
    wait_until(lambda: _engine_calls(predictor) > before["calls"], 60, what="the first segment synthesized")
    s.close()
    wait_until(
        lambda: predictor.metric("tts_requests_total", route=route, code="499") > before["gone"],
        60,
        what="the request counted as 499",
    )
    wait_until(lambda: predictor.metric("tts_in_flight_requests") == 0, 60, what="the engine idle")

    # The segment running when the client left may finish; none after it is started.
    assert _engine_calls(predictor) - before["calls"] <= 2
    assert predictor.metric("tts_requests_total", route=route, code="200") == before["ok"]
    # The server serves on.
    again = predictor.post(route, json={"model": "tts", "input": "Still here.", "response_format": "wav"})
    assert again.status_code == 200
