"""Chunked vocoder streaming: first packet, total time, throughput, memory; against same-run baselines.

  * first packet of the streamed speech route (pcm) vs the whole non-streamed response for the same
    text, per engine: a ~25-word sentence, 3 and 10 sentences (goal <= 0.3x for the single sentence);
    streamed total (last byte) vs whole (goal <= 1.05x, issue 26's; an earlier issue asked 1.1x);
  * the same first packet (ENGINE=auto) vs Piper's own runtime in this process, `PiperVoice.synthesize`
    from the installed piper-tts, time to its first chunk (goal <= 0.35x); and the default engine's
    whole v2 response vs Piper's whole synthesis (goal: Piper's time / ours >= 1.0);
  * whole v2 answers, whole speech answers and the speech stream's first audio on this tree vs the
    tree in BENCH_BEFORE_TREE (default /work/main's checkout, if present) with its own artifact (goal
    >= 0.98x: the one pipeline costs at most 2 %), and what word timestamps add to a whole answer;
  * torch engine resident memory after 50 one-sentence requests of varied length and one
    5,000-character request vs at ready (goal <= 1.3x);
* goal 4's floor (issue 26), the onnx engine as served (its threads and lanes) in this process, no
    HTTP: for one sentence of 26 and 99 characters and the 25 words, what must precede any audio
    (the text encoder, durations and the prior's sample, after the phonemes) and the first piece
    with the configured first window and with the least one (one frame), each vs the whole answer
    (goal <= 0.3x), and the streamed totals with each (goal <= 1.05x): where the least window's
    first piece stays over 0.3x, windows that join into the whole answer cannot meet it here.

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

from bench.common import (
    PARAMS,
    PYTHON,
    THREADS,
    Predictor,
    Row,
    Session,
    SuiteResult,
    aws_env,
    log,
    median,
    settle,
)
from bench.piper import TEXTS as PIPER_TEXTS

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
    first, last, _ = _speech_timed(p, text, stream)
    return first, last


def _speech_timed(p: Predictor, text: str, stream: bool) -> tuple[float, float, float]:
    """(seconds to the first audio byte, seconds to the last, seconds of audio) of one speech request."""
    body = {"model": "tts", "input": text, "response_format": "pcm", "stream": stream}
    start = time.perf_counter()
    first, size = None, 0
    with p.client.stream("POST", "/v1/audio/speech", json=body, timeout=TIMEOUT_S) as r:
        r.raise_for_status()
        for chunk in r.iter_raw():
            if chunk and first is None:
                first = time.perf_counter() - start
            size += len(chunk)
    return first or 0.0, time.perf_counter() - start, size / 2 / 22050


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
                goal="<= 1.05x",
                met=last / whole <= 1.05,
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
        settle()
        ours_first.append(_speech(p, SENTENCE_25, True)[0])
        settle()
        start = time.perf_counter()
        chunks = iter(voice.synthesize(SENTENCE_25, config))
        next(chunks)
        piper_first.append(time.perf_counter() - start)
        for _ in chunks:
            pass
        settle()
        ours_whole.append(_v2(p, SENTENCE_25))
        settle()
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


def _before(session: Session) -> tuple[str, Path] | None:
    """(voice URI, checkout) of the tree to compare with: its own code and its own artifact layout."""
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
    return uri, Path(tree)


# Rounds of the before/after and timestamp comparisons: each is a few percent's question, so more
# samples than the first-packet rows take.
VS_ROUNDS = 15


def _vs_before(res: SuiteResult, session: Session, engine: str, now: Predictor) -> None:
    """This tree against BENCH_BEFORE_TREE on whole v2 answers, whole speech answers and the first
    audio of a speech stream, requests alternating between the two predictors one by one."""
    before = _before(session)
    if before is None:
        res.notes.append("no BENCH_BEFORE_TREE: this tree vs before not measured")
        return
    uri, tree = before
    # Run from its checkout: `python -m predictor` imports the package of its working directory first
    # (PYTHONPATH alone ran this tree's code against the old artifact).
    old = Predictor(
        session, session.path("model"), cwd=tree, ENGINE=engine, VOICE_URI=uri, PYTHONPATH=str(tree)
    )
    kinds: dict[str, Callable[[Predictor, str], float]] = {
        "whole v2": _v2,
        # The speech route takes no noise parameters (and the tree before takes no seed there): its
        # voice's own noise moves each answer's length, so this one is timed per second of audio.
        "whole speech, per audio second": lambda p, t: _per_audio_second(*_speech_timed(p, t, False)[1:]),
        "speech first audio": lambda p, t: _speech(p, t, True)[0],
    }
    # Each text on its own row: one long sentence (its flow runs in pieces when streamed), and three
    # short ones (each too short for that).
    texts = {"25 words": SENTENCE_25, "3 sentences": THREE}
    times: dict[tuple[str, str], tuple[list[float], list[float]]] = {
        (k, name): ([], []) for k in kinds for name in texts
    }
    try:
        old.wait_ready()
        for t in texts.values():
            _v2(old, t), _v2(now, t)
        for _ in range(VS_ROUNDS):
            for name, t in texts.items():
                for kind, fn in kinds.items():
                    times[kind, name][0].append(fn(now, t))
                    times[kind, name][1].append(fn(old, t))
    finally:
        old.stop()
    for (kind, name), (new_t, old_t) in times.items():
        ratio = median(old_t) / median(new_t)
        res.rows.append(
            Row(
                "streaming",
                f"{engine}: {kind}, {name}, this tree vs before",
                median(new_t) * 1000,
                "ms/s" if "per audio second" in kind else "ms",
                baseline_name="before",
                baseline=median(old_t) * 1000,
                ratio=ratio,
                ratio_label="x throughput" if kind.startswith("whole") else "x sooner",
                goal=">= 0.98",
                met=ratio >= 0.98,
                note=f"median of {len(new_t)}, alternating with the other text",
            )
        )


def _per_audio_second(seconds: float, audio_seconds: float) -> float:
    return seconds / audio_seconds


def _timestamps_cost(res: SuiteResult, p: Predictor) -> None:
    """What word timestamps add to a request: the same whole answer with and without them, alternating
    (speech route JSON with words against the plain file; v2 with the words output against without)."""
    texts = [SENTENCE_25, THREE]

    def speech_timed(text: str) -> float:
        body = {"model": "tts", "input": text, "response_format": "pcm", "timestamps": "word", "seed": 7}
        start = time.perf_counter()
        p.client.post(
            "/v1/audio/speech", json=body, headers={"accept": "application/json"}, timeout=TIMEOUT_S
        ).raise_for_status()
        return time.perf_counter() - start

    def speech_plain(text: str) -> float:
        body = {"model": "tts", "input": text, "response_format": "pcm", "seed": 7}
        start = time.perf_counter()
        p.client.post("/v1/audio/speech", json=body, timeout=TIMEOUT_S).raise_for_status()
        return time.perf_counter() - start

    def v2_timed(text: str) -> float:
        body = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
            "parameters": PARAMS,
            "outputs": [{"name": "audio"}, {"name": "audio_length"}, {"name": "words"}],
        }
        start = time.perf_counter()
        p.client.post("/v2/models/tts/infer", json=body, timeout=TIMEOUT_S).raise_for_status()
        return time.perf_counter() - start

    pairs = {
        "speech whole with timestamps": (speech_timed, speech_plain),
        "v2 with the words output": (v2_timed, lambda t: _v2(p, t)),
    }
    for name, (timed, plain) in pairs.items():
        with_t, without = [], []
        for _ in range(VS_ROUNDS):
            for t in texts:
                with_t.append(timed(t))
                without.append(plain(t))
        cost = median(with_t) / median(without)
        res.rows.append(
            Row(
                "streaming",
                f"timestamps: {name}",
                median(with_t) * 1000,
                "ms",
                baseline_name="without",
                baseline=median(without) * 1000,
                ratio=cost,
                note=f"median of {len(with_t)}; seeded alike, so the same audio",
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


# bench piper's two one-sentence texts under 100 characters, where goal 4's first audio is hardest.
FLOOR_TEXTS = {
    "26 characters": PIPER_TEXTS["one short sentence"],
    "99 characters": PIPER_TEXTS["one medium sentence"],
    "25 words": SENTENCE_25,
}
FLOOR_ROUNDS = 11


def _floor(res: SuiteResult, model_dir: Path) -> None:
    """Goal 4's floor, in process: see the module's docstring."""
    from predictor.config import load_settings
    from predictor.engine.base import StreamWindows, SynthesisParams
    from predictor.serving import coldstart

    # As the server makes them (server._add_copies): the serving copy, then the lanes' copy.
    settings = load_settings(engine="onnx", cpu_threads=THREADS, model_dir=model_dir)
    engine = coldstart.copy(settings)
    lane_threads = engine.lane_threads()
    if lane_threads:
        engine.add_lanes(coldstart.copy(settings, lane_threads))
    # The engine's one step before any audio, timed where it runs: a wrapper on its instance, as no
    # public call stops there.
    encode, spent = engine._encode, [0.0]  # type: ignore[attr-defined]

    def timed_encode(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return encode(*args)
        finally:
            spent[0] += time.perf_counter() - start

    engine._encode = timed_encode  # type: ignore[attr-defined]
    params = SynthesisParams(seed=1)
    first = settings.stream_first_window_frames
    sides = {f"first window {first} frames": first, "first window 1 frame (the least)": 1}
    for label, text in FLOOR_TEXTS.items():
        wholes: list[float] = []
        encodes: list[float] = []
        firsts: dict[str, list[float]] = {side: [] for side in sides}
        totals: dict[str, list[float]] = {side: [] for side in sides}
        for r in range(FLOOR_ROUNDS + 1):  # round 0 runs this length's kernels once
            settle()
            spent[0] = 0.0
            start = time.perf_counter()
            engine.synthesize([text], params)
            whole, encoded = time.perf_counter() - start, spent[0]
            for side, frames in sides.items():
                settle()
                start = time.perf_counter()
                pieces = engine.stream_checked(
                    text, params, StreamWindows(frames, settings.stream_window_frames)
                )
                next(pieces)
                head = time.perf_counter() - start
                for _ in pieces:
                    pass
                if r:
                    firsts[side].append(head)
                    totals[side].append(time.perf_counter() - start)
            if r:
                wholes.append(whole)
                encodes.append(encoded)
        whole = median(wholes)
        # (name, seconds, the goal's largest ratio to the whole answer or None)
        rows: list[tuple[str, float, float | None]] = [
            (f"in process: before any audio, {label}", median(encodes), None)
        ]
        for side in sides:
            rows.append((f"in process: first piece, {side}, {label}", median(firsts[side]), 0.3))
            rows.append((f"in process: streamed total, {side}, {label}", median(totals[side]), 1.05))
        for name, value, limit in rows:
            ratio = value / whole
            res.rows.append(
                Row(
                    "streaming",
                    f"onnx {name}",
                    value * 1000,
                    "ms",
                    baseline_name="whole, in process",
                    baseline=whole * 1000,
                    ratio=ratio,
                    goal=f"<= {limit}x" if limit else "",
                    met=ratio <= limit if limit else None,
                    note=""
                    if limit
                    else "the text encoder, durations and prior's sample: no window starts sooner",
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
            ("before", lambda: _vs_before(res, session, "onnx", p)),
            ("timestamps", lambda: _timestamps_cost(res, p)),
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
        model_dir = session.path("model")
        p = Predictor(session, model_dir, ENGINE=engine)
        try:
            p.wait_ready()
            if engine != "torch" and THREADS > 1:
                # onnxruntime's lanes' copy is made after ready (engine/lanes.py): time nothing before it.
                p.wait_for_copies()
            res.details[engine] = _measure(res, session, p, engine)
        finally:
            p.stop()
        if engine == "auto":
            log("streaming: goal 4's floor, in process")
            _floor(res, model_dir)  # the artifact the predictor fetched, once it is gone
    res.notes.append(f"CPU_THREADS={THREADS}; the machine is shared, so compare ratios, not absolute times")
    return res
