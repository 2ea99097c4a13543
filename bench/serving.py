"""Serving under load: batched vs unbatched throughput, first packet of a stream, overload shedding,
and a chapter-length text's time and memory.

Every figure is a ratio to a baseline from the same run. The engine is onnxruntime here: the suite
measures the serving layer (queue, batcher, streaming), and onnxruntime is the faster CPU engine.
"""

from __future__ import annotations

import threading
import time

import httpx

from bench.common import Predictor, Row, Session, SuiteResult, failed_sample, log, median, percentile
from testing.bodies import speech_request, v2_request

LEVELS = (1, 2, 4, 8, 16)
WINDOW_S = 8.0  # closed-loop measuring window per concurrency level
SHORT = "The quick brown fox jumps over the lazy dog."
LONG = " ".join(
    [SHORT, "Serverless speech has to answer the first request fast.", "Then it scales back to zero."] * 3
)
TEN = " ".join(f"This is sentence number {n}, spoken on its own." for n in range(1, 11))


def _closed_loop(url: str, concurrency: int, window_s: float) -> dict:
    """`concurrency` clients send back-to-back requests (3 short : 1 long) for window_s."""
    audio_s, latencies, errors = [0.0], [], [0]
    lock = threading.Lock()
    stop = time.monotonic() + window_s

    def client(i: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            n = 0
            while time.monotonic() < stop:
                text = LONG if (n + i) % 4 == 3 else SHORT
                t = time.perf_counter()
                r = http.post("/v2/models/tts/infer", json=v2_request(text))
                dt = time.perf_counter() - t
                with lock:
                    if r.status_code == 200:
                        body = r.json()
                        outs = {o["name"]: o for o in body["outputs"]}
                        audio_s[0] += outs["audio_length"]["data"][0] / body["parameters"]["sample_rate"]
                        latencies.append(dt)
                    else:
                        errors[0] += 1
                n += 1

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    return {
        "audio_s_per_s": audio_s[0] / wall,
        "requests": len(latencies),
        "errors": errors[0],
        "p50_s": median(latencies) if latencies else None,
    }


def _throughput(session: Session, res: SuiteResult) -> float:
    runs = {}
    for label, batch in (("unbatched", "1"), ("batched", "8")):
        p = Predictor(
            session,
            session.path(f"model-{label}"),
            ENGINE="onnx",
            MAX_BATCH_SIZE=batch,
            MAX_BATCH_DELAY_MS="5",
            MAX_QUEUE="64",
        )
        try:
            p.wait_ready()
            for level in LEVELS:
                runs[(label, level)] = _closed_loop(p.url, level, WINDOW_S)
                log(f"{label} c={level}: {runs[(label, level)]}")
        finally:
            p.stop()
    for level in LEVELS:
        base, batched = runs[("unbatched", level)]["audio_s_per_s"], runs[("batched", level)]["audio_s_per_s"]
        res.rows.append(
            Row(
                "serving",
                f"throughput c={level}, MAX_BATCH_SIZE=8: audio s per s",
                batched,
                "x",
                "MAX_BATCH_SIZE=1",
                base,
                batched / base,
                goal=">= 1.0",
                met=batched / base >= 1.0,
                note=f"{WINDOW_S:.0f} s closed loop, 3 short : 1 long",
            )
        )
    res.details["throughput"] = {f"{k[0]}|{k[1]}": v for k, v in runs.items()}
    return runs[("unbatched", 1)]["requests"] / WINDOW_S  # capacity, requests/s, for the overload test


def _first_packet(p: Predictor, res: SuiteResult) -> None:
    failures: list[str] = []  # samples that do not count: each is reported, none is timed

    def stream_first_chunk() -> float | None:
        t = time.perf_counter()
        with p.client.stream(
            "POST",
            "/v1/audio/speech",
            json=speech_request(TEN, stream=True),
        ) as r:
            chunks = r.iter_bytes()
            head = next(chunks, b"")
            first = time.perf_counter() - t
            for _ in chunks:  # drain, so the next request starts on an idle server
                pass
            why = failed_sample(r.status_code, len(head))
        if why is not None:
            failures.append(f"stream: {why}")
            return None
        return first

    def whole(text: str) -> float | None:
        t = time.perf_counter()
        r = p.client.post("/v1/audio/speech", json=speech_request(text, response_format="pcm"))
        took = time.perf_counter() - t
        why = failed_sample(r.status_code, len(r.content))
        if why is not None:
            failures.append(f"whole: {why}")
            return None
        return took

    firsts: list[float] = []
    alones: list[float] = []
    wholes: list[float] = []
    for _ in range(5):
        for samples, sample in (
            (firsts, stream_first_chunk()),
            (alones, whole(TEN.split(". ")[0] + ".")),
            (wholes, whole(TEN)),
        ):
            if sample is not None:
                samples.append(sample)
    res.details["first_packet_failed_samples"] = failures
    if failures:
        log(f"first packet: {len(failures)} failed samples: {failures}")
    if not (firsts and alones and wholes):
        raise RuntimeError(f"first packet: no successful samples to time ({failures})")
    f, a, w = median(firsts), median(alones), median(wholes)
    res.rows.append(
        Row(
            "serving",
            "first packet, 10-sentence stream",
            f * 1000,
            "ms",
            "first sentence alone",
            a * 1000,
            f / a,
            goal="<= 1.5",
            met=f / a <= 1.5,
            note=f"median of {len(firsts)} successes; {len(failures)} failed samples",
        )
    )
    res.rows.append(
        Row(
            "serving",
            "first packet, 10-sentence stream ",
            f * 1000,
            "ms",
            "whole text",
            w * 1000,
            f / w,
            goal="<= 0.2",
            met=f / w <= 0.2,
            note=f"median of {len(firsts)} successes; {len(failures)} failed samples",
        )
    )


def _overload(p: Predictor, capacity_rps: float, res: SuiteResult) -> None:
    """Open loop at 4x capacity for 15 s: admitted requests' p99 and the share refused (503)."""
    rate = 4 * capacity_rps
    duration = 15.0
    latencies, refused, threads = [], [0], []
    lock = threading.Lock()

    def one() -> None:
        t = time.perf_counter()
        try:
            r = httpx.post(p.url + "/v2/models/tts/infer", json=v2_request(SHORT), timeout=120)
        except httpx.TransportError:
            return
        with lock:
            if r.status_code == 503:
                refused[0] += 1
            elif r.status_code == 200:
                latencies.append(time.perf_counter() - t)

    start = time.monotonic()
    n = 0
    while time.monotonic() - start < duration:
        threads.append(threading.Thread(target=one))
        threads[-1].start()
        n += 1
        time.sleep(max(0.0, start + n / rate - time.monotonic()))
    for t in threads:
        t.join()
    total = len(latencies) + refused[0]
    res.rows.append(
        Row(
            "serving",
            "overload 4x capacity: p99 of admitted",
            percentile(latencies, 99) * 1000,
            "ms",
            "p50 of admitted",
            median(latencies) * 1000,
            percentile(latencies, 99) / median(latencies),
            note=f"{rate:.1f} req/s offered for {duration:.0f} s, MAX_QUEUE=64",
        )
    )
    res.rows.append(
        Row(
            "serving",
            "overload 4x capacity: refused (503)",
            100 * refused[0] / max(total, 1),
            "%",
            note=f"{refused[0]} of {total}; every refusal answered at once with Retry-After",
        )
    )


def _rss_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _chapter(session: Session, res: SuiteResult) -> None:
    """50,000 characters streamed vs 5,000: wall time, RTF, and the server's peak RSS after each."""
    paragraph = (LONG + " ") * 30
    figures = {}
    for chars in (5_000, 50_000):
        p = Predictor(session, session.path(f"model-{chars}"), ENGINE="onnx", MAX_STREAM_TEXT_CHARS="60000")
        try:
            p.wait_ready()
            base = _rss_mib(p.proc.pid, "VmHWM")
            text = (paragraph * (chars // len(paragraph) + 1))[:chars]
            t = time.perf_counter()
            n = 0
            with p.client.stream(
                "POST",
                "/v1/audio/speech",
                timeout=1200,
                json=speech_request(text, stream=True),
            ) as r:
                for chunk in r.iter_bytes():
                    n += len(chunk)
                why = failed_sample(r.status_code, n)
            if why is not None:
                raise RuntimeError(f"{chars}-char stream failed: {why}")
            wall = time.perf_counter() - t
            audio_s = n / 2 / 22050
            figures[chars] = {
                "wall_s": wall,
                "audio_s": audio_s,
                "rtf": wall / audio_s,
                "peak_rss_mib": _rss_mib(p.proc.pid, "VmHWM"),
                "rss_before_mib": base,
            }
            log(f"{chars} chars: {figures[chars]}")
        finally:
            p.stop()
    small, big = figures[5_000], figures[50_000]
    res.rows.append(
        Row(
            "serving",
            "50,000-char text: wall",
            big["wall_s"],
            "s",
            "5,000-char text",
            small["wall_s"],
            big["wall_s"] / small["wall_s"],
            note=f"RTF {big['rtf']:.3f} vs {small['rtf']:.3f}",
        )
    )
    growth_big = big["peak_rss_mib"] - big["rss_before_mib"]
    growth_small = small["peak_rss_mib"] - small["rss_before_mib"]
    res.rows.append(
        Row(
            "serving",
            "50,000-char text: peak RSS growth",
            growth_big,
            "MiB",
            "5,000-char text",
            growth_small,
            growth_big / max(growth_small, 1.0),
            note=f"peak RSS {big['peak_rss_mib']:.0f} vs {small['peak_rss_mib']:.0f} MiB; "
            f"{big['audio_s']:.0f} s of audio would be {big['audio_s'] * 22050 * 4 / 2**20:.0f} MiB as float32",
        )
    )
    res.details["chapter"] = figures


def run(session: Session, chapter: bool = True) -> SuiteResult:
    res = SuiteResult()
    capacity = _throughput(session, res)
    p = Predictor(session, session.path("model-serving"), ENGINE="onnx", MAX_QUEUE="64")
    try:
        p.wait_ready()
        _first_packet(p, res)
        _overload(p, capacity, res)
    finally:
        p.stop()
    if chapter:
        _chapter(session, res)
    res.notes.append("engine: onnxruntime, CPU_THREADS=2; a GPU run (batch 16 vs 1) needs a lent device")
    return res
