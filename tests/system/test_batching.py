"""The batcher over real sockets: merged batches, load shedding with Retry-After, queue timeouts."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from testing.bodies import audio_of, v2_request

LONG = " ".join(["Every request either gets a place in the queue or an answer at once."] * 6)
QUIET = {"noise_scale": 0.0, "noise_w": 0.0}


def concurrently(predictor, bodies: list[dict], stagger_s: float = 0.0) -> list:
    results: list = [None] * len(bodies)

    def call(i: int) -> None:
        results[i] = predictor.post("/v2/models/tts/infer", json=bodies[i], timeout=120)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join()
    return results


def test_concurrent_requests_share_a_batch_and_match_alone(start_predictor):
    predictor = start_predictor(MAX_BATCH_SIZE="4", MAX_BATCH_DELAY_MS="300")
    texts = ["First of three.", "The second request is a little longer.", "Third!"]
    alone = [
        audio_of(predictor.post("/v2/models/tts/infer", json=v2_request(t, **QUIET)).json()) for t in texts
    ]
    batches_before = predictor.metric("tts_batch_size_count")

    together = concurrently(predictor, [v2_request(t, **QUIET) for t in texts])

    assert all(r.status_code == 200 for r in together)
    engine_calls = predictor.metric("tts_batch_size_count") - batches_before
    assert engine_calls < len(texts), "no two requests shared an engine call"
    for response, reference in zip(together, alone, strict=False):
        np.testing.assert_allclose(audio_of(response.json()), reference, atol=5e-4)


def test_full_queue_refuses_at_once_with_retry_after_and_recovers(start_predictor):
    predictor = start_predictor(MAX_QUEUE="1")

    outcome: dict[str, list] = {}

    def load():
        return outcome.setdefault("results", concurrently(predictor, [v2_request(LONG)] * 4, stagger_s=0.05))

    loader = threading.Thread(target=load)
    loader.start()
    latencies = []
    while loader.is_alive():
        start = time.perf_counter()
        assert predictor.get("/v2/health/live").status_code == 200
        latencies.append(time.perf_counter() - start)
        time.sleep(0.05)
    loader.join()
    results = outcome["results"]

    # Liveness under a full queue: generous for a loaded 2-core CI box; the loop never blocks on synthesis.
    assert latencies and max(latencies) < 1.0, latencies
    codes = sorted(r.status_code for r in results)
    refused = [r for r in results if r.status_code == 503]
    assert codes.count(200) >= 2 and refused, codes
    assert all(int(r.headers["retry-after"]) >= 1 and "queue is full" in r.json()["error"] for r in refused)
    assert predictor.metric("tts_rejected_requests_total", reason="queue_full") >= len(refused)
    assert predictor.post("/v2/models/tts/infer", json=v2_request("Back to normal.")).status_code == 200


def test_grpc_overload_is_unavailable(start_predictor):
    predictor = start_predictor(MAX_QUEUE="1")
    blockers = [
        threading.Thread(
            target=predictor.post, args=("/v2/models/tts/infer",), kwargs={"json": v2_request(LONG)}
        )
        for _ in range(2)
    ]
    for t in blockers:
        t.start()
        time.sleep(0.05)
    predictor.wait_for(
        lambda: predictor.metric("tts_queue_depth") >= 1, 60, "a request queued", interval=0.01
    )
    client = triton_grpc.InferenceServerClient(predictor.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Let me in."], dtype=object))

    with pytest.raises(InferenceServerException) as caught:
        client.infer("tts", [text])

    for t in blockers:
        t.join()
    assert "UNAVAILABLE" in str(caught.value.status()) and "queue is full" in caught.value.message()


def test_requests_queued_past_the_timeout_are_dropped(start_predictor):
    # One segment holding the engine past the timeout: a text of several segments would let the
    # queued requests in between two of them (serving/pipeline.py).
    predictor = start_predictor(REQUEST_TIMEOUT_S="0.5", MAX_SEGMENT_CHARS="1000")
    one_call = ", ".join(["every request either gets a place in the queue or an answer at once"] * 6) + "."
    counters = ("tts_synthesis_seconds_count", "tts_batch_size_count", "tts_audio_seconds_count")
    before = {name: predictor.metric(name) for name in counters}

    results = concurrently(
        predictor, [v2_request(one_call), v2_request("Waiting."), v2_request("Also waiting.")], stagger_s=0.05
    )

    assert results[0].status_code == 200
    dropped = [r for r in results[1:] if r.status_code == 503]
    assert dropped and all("REQUEST_TIMEOUT_S" in r.json()["error"] for r in dropped)
    assert predictor.metric("tts_rejected_requests_total", reason="timeout") == len(dropped)
    # Dropped before they cost engine time: the engine ran (and counted) only the answered requests.
    answered = sum(r.status_code == 200 for r in results)
    assert {name: predictor.metric(name) - before[name] for name in counters} == dict.fromkeys(
        counters, answered
    )
    assert predictor.metric("tts_queue_wait_seconds_count") >= 1
