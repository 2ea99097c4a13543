"""Issue 25's attacks on a public endpoint, replayed against one predictor (`python -m bench attacks`).

Each row is what the attack cost the server: engine calls and engine seconds it caused, probe latency
while it ran, connections it still held, log lines it wrote. Run the same file against an older tree
(PYTHONPATH=<tree>) for the "before" column; nothing here depends on settings the older tree lacks
(HEAD_TIMEOUT_S is set, and ignored where it does not exist).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import numpy as np

from bench.common import Predictor, Row, Session, SuiteResult, log
from testing.bodies import v2_request
from testing.slow_clients import stalled

SIX_SENTENCES = " ".join(["The quick brown fox jumps over the lazy dog."] * 6)
HEAD_TIMEOUT_S = 10
IDLE_WAIT_S = 90.0  # how long the server gets to finish what an attack started


def _calls(p: Predictor) -> tuple[float, float]:
    return p.metric("tts_batch_size_count"), p.metric("tts_synthesis_seconds_sum")


def _wait_idle(p: Predictor, limit_s: float = IDLE_WAIT_S) -> float:
    """Seconds until nothing is in flight (or ``limit_s``)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s and p.metric("tts_in_flight_requests") > 0:
        time.sleep(0.2)
    return time.monotonic() - started


def _raw_post(p: Predictor, path: str, body: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", p.http_port), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nHost: predictor\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    s.sendall(head.encode() + body)
    return s


def _combining_marks(p: Predictor) -> list[Row]:
    calls0, secs0 = _calls(p)
    body = {"model": "tts", "input": "a" + "\u0301" * 2000, "response_format": "wav"}
    started = time.monotonic()
    try:
        status = str(p.post("/v1/audio/speech", json=body, timeout=35).status_code)
    except httpx.TimeoutException:
        status = "client gave up at 35 s"
    answered = time.monotonic() - started
    busy = _wait_idle(p)
    calls1, secs1 = _calls(p)
    note = f"answer {status} after {answered:.2f} s; engine busy {busy:.0f} s more" + (
        f" (still busy at {IDLE_WAIT_S:.0f} s)" if busy >= IDLE_WAIT_S else ""
    )
    return [
        Row(
            "attacks",
            "2 KB of combining marks: engine calls",
            calls1 - calls0,
            "calls",
            goal="<= 1",
            met=calls1 - calls0 <= 1,
            note=note,
        ),
        Row(
            "attacks",
            "2 KB of combining marks: engine time",
            secs1 - secs0,
            "s",
            goal="< 1 s",
            met=secs1 - secs0 < 1,
        ),
    ]


def _hang_ups(p: Predictor) -> list[Row]:
    route = "/v1/audio/speech"
    calls0, _ = _calls(p)
    ok0 = p.metric("tts_requests_total", route=route, code="200")
    body = json.dumps({"model": "tts", "input": SIX_SENTENCES, "response_format": "wav"}).encode()
    sockets = [_raw_post(p, route, body) for _ in range(3)]
    time.sleep(1.0)
    for s in sockets:
        s.close()
    _wait_idle(p)
    calls1, _ = _calls(p)
    counted_ok = p.metric("tts_requests_total", route=route, code="200") - ok0
    return [
        Row(
            "attacks",
            "3 six-sentence requests closed after 1 s: segments synthesized",
            calls1 - calls0,
            "calls",
            goal="< 18 (18 = all of them)",
            met=calls1 - calls0 < 18 and counted_ok == 0,
            note=f"{counted_ok:.0f} counted as 200",
        )
    ]


def _probe_latencies(p: Predictor, busy: threading.Event) -> list[float]:
    out = []
    while busy.is_set():
        t = time.perf_counter()
        with contextlib.suppress(httpx.HTTPError):
            p.get("/v2/health/live", timeout=10)
        out.append(time.perf_counter() - t)
        time.sleep(0.02)
    return out


def _big_bodies(p: Predictor) -> list[Row]:
    body = json.dumps(v2_request("a " * 2_000_000)).encode()
    busy = threading.Event()
    busy.set()
    answers: list[tuple[int, float]] = []

    def send() -> None:
        try:
            for _ in range(3):
                t = time.perf_counter()
                r = httpx.post(
                    p.url + "/v2/models/tts/infer",
                    content=body,
                    headers={"content-type": "application/json"},
                    timeout=120,
                )
                answers.append((r.status_code, time.perf_counter() - t))
        finally:
            busy.clear()

    sender = threading.Thread(target=send)
    sender.start()
    probes = _probe_latencies(p, busy)
    sender.join()
    worst = max(probes) * 1e3 if probes else float("nan")
    note = "answers " + ", ".join(f"{code} in {s:.2f} s" for code, s in answers)
    return [
        Row(
            "attacks",
            "4 MB v2 text, three in a row: slowest liveness probe",
            worst,
            "ms",
            goal="< 100 ms",
            met=worst < 100,
            note=note,
        )
    ]


def _stalled_heads(p: Predictor) -> list[Row]:
    with stalled(p.http_port, 200) as sockets:
        time.sleep(HEAD_TIMEOUT_S + 5)
        still_open = 0
        for s in sockets:
            s.setblocking(False)
            try:
                still_open += s.recv(1) != b""
            except BlockingIOError:
                still_open += 1
            except OSError:
                pass
    rows = [
        Row(
            "attacks",
            f"200 stalled request heads: still open after {HEAD_TIMEOUT_S + 5} s",
            still_open,
            "connections",
            goal="0",
            met=still_open == 0,
        )
    ]
    with stalled(p.http_port, 1050):
        codes = [p.get(path, timeout=1).status_code for path in ("/v2/health/live", "/v2/models/tts/ready")]
    rows.append(
        Row(
            "attacks",
            "1,050 stalled connections (MAX_CONNECTIONS=1000): probes answered 200",
            sum(c == 200 for c in codes),
            "of 2",
            goal="2",
            met=codes == [200, 200],
            note=f"statuses {codes}",
        )
    )
    return rows


def _client_error_logs(p: Predictor) -> list[Row]:
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    before = len(p.logs().splitlines())
    client = triton_grpc.InferenceServerClient(p.grpc)
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Hello."], dtype=object))
    for _ in range(20):
        with contextlib.suppress(InferenceServerException):
            client.infer("no-such-model", [text])
    lines = p.logs().splitlines()[before:]
    tracebacks = sum("Traceback" in line or '"exc"' in line for line in lines)
    return [
        Row(
            "attacks",
            "20 gRPC calls to an unknown model: log lines written",
            len(lines),
            "lines",
            goal="<= 5, no traceback",
            met=len(lines) <= 5 and tracebacks == 0,
            note=f"{tracebacks} with a traceback",
        )
    ]


def _small_ones(p: Predictor) -> list[Row]:
    nan = p.post(
        "/v1/audio/speech",
        content=b'{"model":"tts","input":"Hi.","speed":NaN}',
        headers={"content-type": "application/json"},
    )
    event = p.post(
        "/v1/models/tts:predict",
        headers={
            "ce-specversion": "1.0",
            "ce-id": "x",
            "ce-source": "/b",
            "ce-type": "dev.tts-predictor.synthesize.v1",
            "content-type": "application/json",
        },
        content=b'{"text": ',
    )
    seed = p.post("/v2/models/tts/infer", json={**v2_request("Hi."), "parameters": {"seed": 2**80}})
    return [
        Row("attacks", f"speed NaN: {nan.status_code}", 0, "", note=nan.text[:120]),
        Row("attacks", f"event with bad JSON data: {event.status_code}", 0, "", note=event.text[:120]),
        Row("attacks", f"seed 2**80: {seed.status_code}", 0, "", note=seed.text[:120]),
    ]


def run(session: Session) -> SuiteResult:
    res = SuiteResult()
    p = Predictor(
        session,
        session.path("model-attacks"),
        ENGINE="onnx",
        HEAD_TIMEOUT_S=str(HEAD_TIMEOUT_S),
        MAX_CONNECTIONS="1000",
    )
    p.wait_ready(600)
    for attack in (_combining_marks, _hang_ups, _big_bodies, _stalled_heads, _client_error_logs, _small_ones):
        log(f"attacks: {attack.__name__}")
        res.rows += attack(p)
    return res
