"""Ours against Piper's own HTTP server on its own voice (issue 26), in one run: whole-response latency
per text length, our first audio, throughput and p99 with 4 and 8 concurrent clients, resident memory
after the run, and exec -> first answer.

Both servers run from this venv, so the same onnxruntime and espeak-ng, on 127.0.0.1 with all of the
machine's CPUs: ours as `make run` starts it (ENGINE=auto: onnxruntime on CPU; the speech route, WAV),
Piper's as `python -m piper.http_server -m model.onnx` (Flask's threaded server, one PiperVoice,
`POST /synthesize`). Single requests alternate between the two, one at a time, so neither's work
overlaps the other's; the figure is the median of ROUNDS. Concurrent load runs one server at a time,
in alternating order.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx
import psutil

from bench.common import (
    PYTHON,
    THREADS,
    Predictor,
    Row,
    Session,
    SuiteResult,
    log,
    median,
    percentile,
    settle,
)
from testing.ports import free_port

ROUNDS = 7
TEXTS = {
    "one short sentence": "The weather is nice today.",
    "one medium sentence": (
        "Speech synthesis turns written text into spoken audio, one sentence at a time, for anyone who asks."
    ),
    "one long sentence": (
        "When the first request of the morning arrives at a service that has been scaled to zero overnight, "
        "the platform has to start a container, fetch the voice from object storage, verify every byte of "
        "it, load it into memory and warm it up, and only then can it answer, which is why every second of "
        "that path matters to whoever is waiting for the audio."
    ),
    "three sentences": (
        "The station was quiet before dawn. A single train waited at the far platform, its engine humming. "
        "Then the doors opened and the first passengers of the day stepped inside."
    ),
    "ten sentences": " ".join(
        [
            "Rain fell all night.",
            "By morning the river had risen.",
            "The old bridge held.",
            "Farmers came to look at it.",
            "Some of them had crossed it as children.",
            "Nobody remembered who had built it.",
            "A teacher brought her class to see the water.",
            "They counted the boats that drifted past.",
            "At noon the sun came out at last.",
            "By evening the river was calm again, and the town went home to dinner.",
        ]
    ),
}
CONCURRENCY = (4, 8)
# The CPU parallelism whose throughput is measured (BENCH_PIPER_WORKERS, comma-separated): W for
# ENGINE_WORKERS=W with the settings' own split of the CPUs, WxT for W workers of T intra-op threads
# each (CPU_THREADS=W*T); the table that chooses the default.
WORKERS = tuple(os.environ.get("BENCH_PIPER_WORKERS", "1,2").split(","))


def _parallelism(spec: str) -> dict[str, str]:
    """The predictor's environment for one BENCH_PIPER_WORKERS entry."""
    workers, _, threads = spec.partition("x")
    env = {"ENGINE_WORKERS": str(int(workers))}
    if threads:
        env["CPU_THREADS"] = str(int(workers) * int(threads))
    return env


def _label(spec: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in _parallelism(spec).items())


LOAD_REQUESTS = 24  # per level: medium sentences and three-sentence texts, alternating
FIRST_AUDIO_GOAL = 0.3  # of our whole response, for texts of 25 characters and more
WHOLE_GOAL = 0.95  # ours / Piper's
THROUGHPUT_GOAL = 1.2  # ours / Piper's


class PiperServer:
    """`python -m piper.http_server` on the published voice's model.onnx (its config beside it, where
    PiperVoice.load looks: model.onnx.json)."""

    def __init__(self, session: Session, model_dir: Path):
        shutil.copyfile(model_dir / "config.json", model_dir / "model.onnx.json")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.started = time.perf_counter()
        self.child = session.start(
            "piper-http",
            [
                PYTHON,
                "-m",
                "piper.http_server",
                "-m",
                str(model_dir / "model.onnx"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            {},
        )

    def first_answer_s(self, timeout: float = 120.0) -> float:
        """Seconds from exec to its first 200 on a synthesis (it has no readiness route)."""

        def answered() -> bool:
            try:
                return (
                    httpx.post(self.url + "/synthesize", json={"text": "Hi."}, timeout=30).status_code == 200
                )
            except httpx.TransportError:
                return False

        self.child.wait_for(answered, timeout, "piper's first answer", 0.02)
        return time.perf_counter() - self.started

    def synthesize(self, client: httpx.Client, text: str) -> bytes:
        r = client.post(self.url + "/synthesize", json={"text": text}, timeout=300)
        r.raise_for_status()
        return r.content


def _ours(client: httpx.Client, p: Predictor, text: str) -> bytes:
    r = client.post(
        p.url + "/v1/audio/speech",
        json={"model": "tts", "input": text, "response_format": "wav"},
        timeout=300,
    )
    r.raise_for_status()
    return r.content


def _our_first_audio(client: httpx.Client, p: Predictor, text: str) -> tuple[float, float]:
    """(first audio byte, whole stream) seconds of the streamed speech route."""
    body = {"model": "tts", "input": text, "response_format": "pcm", "stream": True}
    start = time.perf_counter()
    first = None
    with client.stream("POST", p.url + "/v1/audio/speech", json=body, timeout=300) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - start
    total = time.perf_counter() - start
    return (first if first is not None else total), total


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _lone(fn: Callable[[], object]) -> float:
    """Seconds of one request sent alone, after SETTLE_S of quiet."""
    settle()
    return _timed(fn)


def _load(send: Callable[[httpx.Client, str], bytes], clients: int) -> tuple[float, list[float]]:
    """(requests per second, latencies) of LOAD_REQUESTS requests from ``clients`` concurrent clients."""
    texts = [TEXTS["one medium sentence"], TEXTS["three sentences"]] * (LOAD_REQUESTS // 2)
    latencies: list[float] = []
    with httpx.Client(limits=httpx.Limits(max_connections=clients)) as client:

        def one(text: str) -> None:
            latencies.append(_timed(lambda: send(client, text)))

        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, texts))
        wall = time.perf_counter() - start
    return len(texts) / wall, latencies


def run(session: Session) -> SuiteResult:
    res = SuiteResult()
    p = Predictor(session, session.path("model-piper-ours"))
    ours_ready_s = p.wait_ready(600)
    if THREADS > 1:
        # The lanes' copy is made after ready, with both CPUs: time nothing beside it.
        p.wait_for_copies()
    piper_dir = session.path("piper-voice")
    from predictor.artifact.fetch import fetch

    fetch(session.voice, piper_dir)  # every file, model.onnx included
    piper = PiperServer(session, piper_dir)
    piper_ready_s = piper.first_answer_s()
    log(f"piper: ours ready in {ours_ready_s:.2f} s, Piper's first answer {piper_ready_s:.2f} s after exec")

    details: dict[str, object] = {}
    with httpx.Client() as client:
        for send in (lambda t: _ours(client, p, t), lambda t: piper.synthesize(client, t)):
            send(TEXTS["one medium sentence"])  # warm both
        for name, text in TEXTS.items():
            ours, theirs, firsts = [], [], []
            for _ in range(ROUNDS):
                ours.append(_lone(partial(_ours, client, p, text)))
                theirs.append(_lone(partial(piper.synthesize, client, text)))
                settle()
                firsts.append(_our_first_audio(client, p, text)[0])
            whole, base = median(ours), median(theirs)
            res.rows.append(
                Row(
                    "piper",
                    f"whole, {name} ({len(text)} chars)",
                    whole * 1e3,
                    "ms",
                    "Piper's server",
                    base * 1e3,
                    whole / base,
                    goal=f"<= {WHOLE_GOAL}x",
                    met=whole / base <= WHOLE_GOAL,
                    note=f"IQR ours {_iqr(ours) * 1e3:.0f} ms, Piper {_iqr(theirs) * 1e3:.0f} ms",
                )
            )
            first = median(firsts)
            res.rows.append(
                Row(
                    "piper",
                    f"our first audio, {name}",
                    first * 1e3,
                    "ms",
                    "our whole",
                    whole * 1e3,
                    first / whole,
                    goal=f"<= {FIRST_AUDIO_GOAL}x",
                    met=first / whole <= FIRST_AUDIO_GOAL,
                )
            )
            details[name] = {"ours_s": ours, "piper_s": theirs, "first_s": firsts}
    # The CPU parallelism to choose from: one predictor per ENGINE_WORKERS value, each loaded only now
    # (idle while the others are measured), all against the same Piper server.
    ours = {"1": p}
    for workers in WORKERS:
        if workers not in ours:
            ours[workers] = Predictor(
                session, session.path(f"model-piper-ours-{workers}"), **_parallelism(workers)
            )
            ours[workers].wait_ready(600)
            if THREADS > 1:
                # The workers' and lanes' copies are made after ready, with both CPUs: time nothing
                # beside them (a first run here timed lone requests 1.6x slower than once they were there).
                ours[workers].wait_for_copies()
    with httpx.Client() as client:
        # A lone request on each other parallelism: with a solo worker it should cost what one worker's does.
        for workers in WORKERS:
            if workers == "1":
                continue
            # Each text once first, as the first predictor had them before its table: a fresh one's
            # first requests run slower (26 characters: 100, 77, 73, 135 ms, then 58-67).
            for text in TEXTS.values():
                _ours(client, ours[workers], text)
            for name in ("one short sentence", "one medium sentence"):
                text = TEXTS[name]
                mine, theirs = [], []
                for _ in range(ROUNDS):
                    mine.append(_lone(partial(_ours, client, ours[workers], text)))
                    theirs.append(_lone(partial(piper.synthesize, client, text)))
                res.rows.append(
                    Row(
                        "piper",
                        f"whole, {name}, {_label(workers)}",
                        median(mine) * 1e3,
                        "ms",
                        "Piper's server",
                        median(theirs) * 1e3,
                        median(mine) / median(theirs),
                        goal=f"<= {WHOLE_GOAL}x",
                        met=median(mine) / median(theirs) <= WHOLE_GOAL,
                        note="one request at a time",
                    )
                )
    for clients in CONCURRENCY:
        # Alternate which server goes first, so drift on the machine hits both.
        order = [(f"ours-{w}", _ours_sender(ours[w])) for w in WORKERS] + [("piper", piper.synthesize)]
        if clients % 8 == 0:
            order.reverse()
        measured = {name: _load(send, clients) for name, send in order}
        piper_rps, piper_lat = measured["piper"]
        for workers in WORKERS:
            ours_rps, ours_lat = measured[f"ours-{workers}"]
            res.rows += [
                Row(
                    "piper",
                    f"throughput, {clients} clients, {_label(workers)}",
                    ours_rps,
                    "req/s",
                    "Piper's server",
                    piper_rps,
                    ours_rps / piper_rps,
                    goal=f">= {THROUGHPUT_GOAL}x",
                    met=ours_rps / piper_rps >= THROUGHPUT_GOAL,
                    note=f"{LOAD_REQUESTS} requests, medium and three-sentence texts",
                ),
                Row(
                    "piper",
                    f"p99, {clients} clients, {_label(workers)}",
                    percentile(ours_lat, 99) * 1e3,
                    "ms",
                    "Piper's p99",
                    percentile(piper_lat, 99) * 1e3,
                    percentile(ours_lat, 99) / percentile(piper_lat, 99),
                    goal="<= 1.0x",
                    met=percentile(ours_lat, 99) <= percentile(piper_lat, 99),
                ),
            ]
            details[f"load_{clients}_workers_{workers}"] = {"ours_s": ours_lat, "piper_s": piper_lat}
    for workers in WORKERS:
        if workers != "1":
            rss = psutil.Process(ours[workers].proc.pid).memory_info().rss
            res.rows.append(
                Row(
                    "piper",
                    f"resident memory after the run, {_label(workers)}",
                    rss / 2**20,
                    "MiB",
                    "Piper's server",
                    psutil.Process(piper.child.proc.pid).memory_info().rss / 2**20,
                    rss / psutil.Process(piper.child.proc.pid).memory_info().rss,
                    goal="<= 1.0x",
                )
            )
    ours_rss = psutil.Process(p.proc.pid).memory_info().rss
    piper_rss = psutil.Process(piper.child.proc.pid).memory_info().rss
    res.rows += [
        Row(
            "piper",
            "resident memory after the run",
            ours_rss / 2**20,
            "MiB",
            "Piper's server",
            piper_rss / 2**20,
            ours_rss / piper_rss,
            goal="<= 1.0x",
            met=ours_rss <= piper_rss,
        ),
        Row(
            "piper",
            "exec -> ready (ours) / first answer (Piper's)",
            ours_ready_s,
            "s",
            "Piper's server",
            piper_ready_s,
            ours_ready_s / piper_ready_s,
            note="ours includes the fetch from the local S3; Piper's reads a local file",
        ),
    ]
    res.details = details
    return res


def _ours_sender(p: Predictor) -> Callable[[httpx.Client, str], bytes]:
    return lambda client, text: _ours(client, p, text)


def _iqr(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]
