"""Chunked vocoder streaming: first packet, total time, throughput, memory; against same-run baselines.

  * first packet of the streamed speech route (pcm) vs the whole non-streamed response for the same
    text, per engine: a ~25-word sentence, 3 and 10 sentences (goal <= 0.3x for the single sentence);
    streamed total (last byte) vs whole (goal <= 1.1x);
  * the same first packet (ENGINE=auto) vs Piper's own runtime in this process, `PiperVoice.synthesize`
    from the installed piper-tts, time to its first chunk (goal <= 0.35x); and the default engine's
    whole v2 response vs Piper's whole synthesis (goal: Piper's time / ours >= 1.0);
  * whole-response v2 latency on this tree (chunking code present, unused) vs the tree in
    BENCH_BEFORE_TREE (default /work/main's checkout, if present) with its own artifact (goal >= 0.97x
    throughput);
  * torch engine resident memory after 50 one-sentence requests of varied length and one
    5,000-character request vs at ready (goal <= 1.3x).

Requests alternate between the compared sides one by one, so a neighbour's load lands on both alike.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.common import PARAMS, PYTHON, THREADS, Predictor, Row, Session, SuiteResult, aws_env, log, median

SENTENCE_25 = (
    "When the evening train finally pulled into the quiet station, the tired travellers gathered "
    "their heavy bags and stepped out into the cold mountain air."
)
THREE = (
    "The first sentence sets the scene. The second one adds a detail or two about the weather. "
    "And the third closes the little story."
)
TEN = " ".join(f"This is sentence number {n}, spoken on its own." for n in range(1, 11))
TEXTS = {"25 words": SENTENCE_25, "3 sentences": THREE, "10 sentences": TEN}
ROUNDS = 3
# A 5,000-character request on the torch engine is minutes of CPU on a shared 2-core box.
TIMEOUT_S = 1800


def _speech(p: Predictor, text: str, stream: bool) -> tuple[float, float]:
    """(seconds to the first audio byte, seconds to the last) of one speech request."""
    body = {"model": "tts", "input": text, "response_format": "pcm", "stream": stream}
    start = time.perf_counter()
    first = None
    with p.client.stream("POST", "/v1/audio/speech", json=body, timeout=TIMEOUT_S) as r:
        r.raise_for_status()
        for chunk in r.iter_raw():
            if chunk and first is None:
                first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start


def _v2(p: Predictor, text: str) -> float:
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
        "parameters": PARAMS,
    }
    start = time.perf_counter()
    p.client.post("/v2/models/tts/infer", json=body, timeout=TIMEOUT_S).raise_for_status()
    return time.perf_counter() - start


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def _first_packets(res: SuiteResult, p: Predictor, engine: str) -> dict[str, float]:
    out = {}
    for label, text in TEXTS.items():
        firsts, lasts, wholes = [], [], []
        _speech(p, text, True)  # this length's kernels
        for _ in range(ROUNDS):
            first, last = _speech(p, text, True)
            wholes.append(_speech(p, text, False)[1])
            firsts.append(first)
            lasts.append(last)
        first, last, whole = median(firsts), median(lasts), median(wholes)
        out[label] = first
        goal = "<= 0.3x" if label == "25 words" else ""
        res.rows.append(
            Row(
                "streaming",
                f"{engine}: first packet, {label}",
                first * 1000,
                "ms",
                baseline_name="whole",
                baseline=whole * 1000,
                ratio=first / whole,
                goal=goal,
                met=(first / whole <= 0.3) if goal else None,
            )
        )
        res.rows.append(
            Row(
                "streaming",
                f"{engine}: streamed total, {label}",
                last * 1000,
                "ms",
                baseline_name="whole",
                baseline=whole * 1000,
                ratio=last / whole,
                goal="<= 1.1x",
                met=last / whole <= 1.1,
            )
        )
    return out


def _piper(res: SuiteResult, p: Predictor, model_dir: Path) -> None:
    """Piper's own runtime in this process vs the default engine, interleaved."""
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    voice = PiperVoice.load(model_dir / "model.onnx", model_dir / "config.json")
    config = SynthesisConfig(noise_scale=0.667, noise_w_scale=0.8)
    next(iter(voice.synthesize(SENTENCE_25, config)))  # warm
    ours_first, piper_first, ours_whole, piper_whole = [], [], [], []
    for _ in range(ROUNDS):
        ours_first.append(_speech(p, SENTENCE_25, True)[0])
        start = time.perf_counter()
        chunks = iter(voice.synthesize(SENTENCE_25, config))
        next(chunks)
        piper_first.append(time.perf_counter() - start)
        for _ in chunks:
            pass
        ours_whole.append(_v2(p, SENTENCE_25))
        start = time.perf_counter()
        for _ in voice.synthesize(SENTENCE_25, SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)):
            pass
        piper_whole.append(time.perf_counter() - start)
    first, base = median(ours_first), median(piper_first)
    res.rows.append(
        Row(
            "streaming",
            "auto: first packet vs Piper's first chunk, 25 words",
            first * 1000,
            "ms",
            baseline_name="piper.PiperVoice",
            baseline=base * 1000,
            ratio=first / base,
            goal="<= 0.35x",
            met=first / base <= 0.35,
            note="Piper in-process (no HTTP); onnxruntime's default threads",
        )
    )
    ours, theirs = median(ours_whole), median(piper_whole)
    res.rows.append(
        Row(
            "streaming",
            "auto: whole v2 response, 25 words (speed vs Piper)",
            ours * 1000,
            "ms",
            baseline_name="piper.PiperVoice",
            baseline=theirs * 1000,
            ratio=theirs / ours,
            ratio_label="x speed",
            goal=">= 1.0",
            met=theirs / ours >= 1.0,
            note="ours includes HTTP",
        )
    )


def _before(session: Session) -> tuple[str, dict[str, str]] | None:
    """(voice URI, env) of the tree to compare with: its own code and its own artifact layout."""
    tree = os.environ.get("BENCH_BEFORE_TREE", "/work/main")
    if not (Path(tree) / "predictor").is_dir():
        return None
    uri = "s3://bench-voices/before"
    src = session.path("before-voice")
    script = (
        "import sys; from pathlib import Path\n"
        "from predictor.artifact.publish import build_default_voice, publish\n"
        f"build_default_voice(Path({str(src)!r})); publish(Path({str(src)!r}), {uri!r})\n"
    )
    env = {**os.environ, **aws_env(session.moto), "PYTHONPATH": tree}
    subprocess.run([PYTHON, "-c", script], env=env, check=True, cwd=tree, capture_output=True)
    return uri, {"PYTHONPATH": tree}


def _throughput_vs_before(res: SuiteResult, session: Session, engine: str, now: Predictor) -> None:
    before = _before(session)
    if before is None:
        res.notes.append("no BENCH_BEFORE_TREE: throughput vs before not measured")
        return
    uri, env = before
    old = Predictor(session, session.path("model"), ENGINE=engine, VOICE_URI=uri, **env)
    try:
        old.wait_ready()
        texts = [SENTENCE_25, THREE]
        for t in texts:
            _v2(old, t), _v2(now, t)
        new_t, old_t = [], []
        for _ in range(ROUNDS * 2):
            for t in texts:
                new_t.append(_v2(now, t))
                old_t.append(_v2(old, t))
    finally:
        old.stop()
    ratio = median(old_t) / median(new_t)
    res.rows.append(
        Row(
            "streaming",
            f"{engine}: whole v2 throughput, this tree vs before",
            median(new_t) * 1000,
            "ms",
            baseline_name="before",
            baseline=median(old_t) * 1000,
            ratio=ratio,
            ratio_label="x throughput",
            goal=">= 0.97",
            met=ratio >= 0.97,
        )
    )


def _torch_memory(res: SuiteResult, p: Predictor) -> None:
    pid = p.child.proc.pid
    at_ready = _rss_mib(pid)
    words = SENTENCE_25.split()
    for n in range(50):
        length = 3 + (n * 7) % (len(words) - 3)  # varied lengths: a new input length on most requests
        _v2(p, " ".join(words[:length]) + ".")
    long_text = ((TEN + " ") * 20)[:5000]
    _v2(p, long_text)
    after = _rss_mib(pid)
    res.rows.append(
        Row(
            "streaming",
            "torch: RSS after 50 varied requests + one 5,000-char",
            after,
            "MiB",
            baseline_name="at ready",
            baseline=at_ready,
            ratio=after / at_ready,
            goal="<= 1.3x",
            met=after / at_ready <= 1.3,
        )
    )


def _piper_dir(session: Session) -> Path:
    from predictor.artifact.fetch import fetch

    piper_dir = session.path("piper")
    fetch(session.voice, piper_dir)  # every file, model.onnx included
    return piper_dir


def _measure(res: SuiteResult, session: Session, p: Predictor, engine: str) -> dict[str, float]:
    """Every measurement of one predictor; a part that fails (a timeout on a loaded box) becomes a note
    and keeps the other parts' rows."""
    firsts: dict[str, float] = {}
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("first packets", lambda: firsts.update(_first_packets(res, p, engine)))
    ]
    if engine == "auto":
        parts += [
            ("piper", lambda: _piper(res, p, _piper_dir(session))),
            ("before", lambda: _throughput_vs_before(res, session, "onnx", p)),
        ]
    else:
        parts.insert(0, ("memory", lambda: _torch_memory(res, p)))  # first: RSS at ready is its baseline
    for name, part in parts:
        log(f"streaming: {engine} {name}")
        try:
            part()
        except (httpx.HTTPError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
            res.notes.append(f"{engine} {name} failed: {exc!r}")
    return firsts


def run(session: Session) -> SuiteResult:
    res = SuiteResult()
    # BENCH_STREAMING_ENGINES=auto skips the torch half (its 5,000-character memory run takes minutes).
    for engine in os.environ.get("BENCH_STREAMING_ENGINES", "auto,torch").split(","):
        log(f"streaming: {engine}")
        p = Predictor(session, session.path("model"), ENGINE=engine)
        try:
            p.wait_ready()
            res.details[engine] = _measure(res, session, p, engine)
        finally:
            p.stop()
    res.notes.append(f"CPU_THREADS={THREADS}; the machine is shared, so compare ratios, not absolute times")
    return res
