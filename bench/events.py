"""The cost of durability: synthesis events with outputs to S3 against plain v2 requests for the same texts.

One predictor (onnxruntime, as in `serving`: this measures the serving layer, not the engine) serves
both, in the same run: the same texts first as v2 requests, then as binary-mode CloudEvents whose
audio goes to S3 with a completion record, then the same events again (a broker's redelivery, answered
from the record). Concurrency is closed loop: `concurrency` clients each send their share back to back.

moto stands in for S3: it keeps objects in memory and copies them whole, so it is right for
correctness but says little about a real S3's upload latency; the ratio here is the overhead of our
own path (encode, hash, two S3 round trips before and after synthesis) on a fast local store.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable

import httpx

from bench.common import PARAMS, Predictor, Row, Session, SuiteResult, log, median
from testing.bodies import v2_request
from testing.s3 import s3_client

BUCKET = "bench-event-outputs"
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Serverless speech has to answer the first request fast.",
    "Then it scales back to zero.",
    "Every event lands in storage exactly once.",
)
REQUEST_TYPE = "dev.tts-predictor.synthesize.v1"


def _closed_loop(url: str, jobs: list[Callable[[httpx.Client], httpx.Response]], concurrency: int) -> dict:
    """Run every job once over `concurrency` clients; requests/s over the wall time, latencies, failures."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    queue = list(reversed(jobs))

    def client() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    job = queue.pop()
                t = time.perf_counter()
                r = job(http)
                dt = time.perf_counter() - t
                with lock:
                    if r.status_code == 200:
                        latencies.append(dt)
                    else:
                        failures.append(f"{r.status_code} {r.text[:200]}")

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(jobs)} requests failed, first: {failures[0]}")
    return {"requests_per_s": len(latencies) / wall, "p50_s": median(latencies), "requests": len(latencies)}


def _event(text: str, event_id: str, output: str) -> Callable[[httpx.Client], httpx.Response]:
    headers = {
        "ce-specversion": "1.0",
        "ce-type": REQUEST_TYPE,
        "ce-source": "/bench/events",
        "ce-id": event_id,
        "content-type": "application/json",
    }
    body = json.dumps({"text": text, "output": output, **PARAMS})
    return lambda http: http.post("/v1/models/tts:predict", headers=headers, content=body)


def run(session: Session, requests: int = 40, concurrency: int = 2) -> SuiteResult:
    res = SuiteResult()
    s3 = s3_client(session.moto)
    s3.create_bucket(Bucket=BUCKET)
    texts = [TEXTS[i % len(TEXTS)] for i in range(requests)]
    run_id = uuid.uuid4().hex[:8]
    events = [_event(t, f"{run_id}-{i}", f"s3://{BUCKET}/{run_id}/{i}.wav") for i, t in enumerate(texts)]
    plain = [lambda http, t=t: http.post("/v2/models/tts/infer", json=v2_request(t, **PARAMS)) for t in texts]

    p = Predictor(
        session,
        session.path("model-events"),
        ENGINE="onnx",
        MAX_QUEUE="64",
        CE_OUTPUT_PREFIXES=f"s3://{BUCKET}",
    )
    try:
        p.wait_ready()
        _closed_loop(p.url, plain[: min(4, requests)], 1)  # warm the route and the S3 client's imports alike
        _closed_loop(p.url, [_event(TEXTS[0], f"{run_id}-warm", f"s3://{BUCKET}/{run_id}/warm.wav")], 1)
        figures = {
            "v2": _closed_loop(p.url, plain, concurrency),
            "events": _closed_loop(p.url, events, concurrency),
            "redelivered": _closed_loop(p.url, events, concurrency),
        }
        written = p.samples("tts_event_outputs_total", "outcome")
    finally:
        p.stop()
    for name, f in figures.items():
        log(f"{name}: {f}")
    v2, ev, again = figures["v2"], figures["events"], figures["redelivered"]
    stored = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{run_id}/")
    audio_objects = [o for o in stored.get("Contents", []) if o["Key"].endswith(".wav")]
    if len(audio_objects) != requests + 1 or written.get("replayed", 0) != requests:
        raise RuntimeError(
            f"expected {requests + 1} outputs and {requests} replays, got {len(audio_objects)} "
            f"and {written.get('replayed')}: exactly-once is broken, the figures mean nothing"
        )
    note = f"{requests} requests, {concurrency} clients, 4 texts of 28-56 chars, onnx, moto as S3 (in memory)"
    res.rows.append(
        Row(
            "events",
            "events with S3 output: requests/s",
            ev["requests_per_s"],
            "req/s",
            "v2 requests, same texts",
            v2["requests_per_s"],
            ev["requests_per_s"] / v2["requests_per_s"],
            goal=">= 0.8",
            met=ev["requests_per_s"] / v2["requests_per_s"] >= 0.8,
            note=note,
        )
    )
    res.rows.append(
        Row(
            "events",
            "events with S3 output: p50 latency",
            ev["p50_s"] * 1000,
            "ms",
            "v2 requests, same texts",
            v2["p50_s"] * 1000,
            ev["p50_s"] / v2["p50_s"],
            note=note,
        )
    )
    res.rows.append(
        Row(
            "events",
            "redelivered events (from the record): p50",
            again["p50_s"] * 1000,
            "ms",
            "v2 requests, same texts",
            v2["p50_s"] * 1000,
            again["p50_s"] / v2["p50_s"],
            goal="< 1.0",
            met=again["p50_s"] < v2["p50_s"],
            note="no synthesis: one S3 GET of the completion record",
        )
    )
    res.details.update(figures)
    res.notes.append(
        "moto copies whole objects in memory: right for correctness, not a measure of S3 upload "
        "speed; each event makes four S3 round trips (record GET and object HEAD before synthesis, "
        "object PUT and record PUT after), so on real S3 the overhead grows by their latencies"
    )
    return res
