"""torch vs onnxruntime on this CPU, in-process: single requests, batches of 4 and 8, eager vs compiled.

Both engines load the same published artifact and use the same thread count; calls alternate
between engines one by one so a neighbour's load on the machine lands on both sides alike.
Throughput is seconds of audio produced per wall second; RTF is its inverse.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.common import THREADS, Row, Session, SuiteResult, log, median

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Serverless speech has to be fast from the very first request.",
    "Hi there!",
    "At three o'clock on the twelfth of May, 2026, the canary received ten percent of the traffic.",
    "Scale to zero when idle, and answer quickly when called again.",
    "Numbers like 42, 3.14 and 1,000,000 are read out in full.",
    "Short one.",
    "A longer sentence, with commas, clauses, and pauses, tests the duration predictor on varied rhythm.",
]
ROUNDS = 5


def _engine(model_dir: Path, name: str, compiled: bool = False):
    from predictor.config import load_settings
    from predictor.engine.factory import create

    settings = load_settings(engine=name, cpu_threads=THREADS, compile=compiled)
    engine = create(settings)
    start = time.perf_counter()
    engine.load(model_dir)
    loaded = time.perf_counter()
    engine.warmup(settings.warmup_text)
    return engine, loaded - start, time.perf_counter() - loaded


def _throughput(engine, texts: list[str], params) -> tuple[float, float]:
    """(audio seconds per wall second, wall seconds) for one call with all texts."""
    start = time.perf_counter()
    audio = engine.synthesize(texts, params)
    wall = time.perf_counter() - start
    return sum(len(a) for a in audio) / engine.sample_rate / wall, wall


def run(session: Session, compiled: bool = True) -> SuiteResult:
    from predictor.artifact.fetch import fetch
    from predictor.engine.base import SynthesisParams

    res = SuiteResult()
    model_dir = session.path("model")
    fetch(session.voice, model_dir)  # both engines' files
    params = SynthesisParams(noise_scale=0.667, noise_w=0.8, seed=None)

    engines = {}
    setup = {}
    for name in ("onnx", "torch"):
        engines[name], load_s, warm_s = _engine(model_dir, name)
        setup[name] = {"load_s": load_s, "warmup_s": warm_s}
    if compiled:
        log("compiling the torch decoder (torch.compile, dynamic shapes); this takes a while")
        engines["torch-compiled"], load_s, warm_s = _engine(model_dir, "torch", compiled=True)
        setup["torch-compiled"] = {"load_s": load_s, "warmup_s": warm_s}

    workloads = {"single": SENTENCES[:1], "batch of 4": SENTENCES[:4], "batch of 8": SENTENCES[:8]}
    speeds: dict[tuple[str, str], list[float]] = {}
    for i in range(ROUNDS):
        for workload, texts in workloads.items():
            for name, engine in engines.items():
                speed, _ = _throughput(engine, texts, params)
                speeds.setdefault((name, workload), []).append(speed)
        log(f"round {i + 1}/{ROUNDS} done")

    for workload in workloads:
        base = median(speeds[("onnx", workload)])
        res.rows.append(
            Row(
                "engines",
                f"onnxruntime, {workload}: audio s per wall s",
                base,
                "x",
                note=f"RTF {1 / base:.3f}; median of {ROUNDS}",
            )
        )
        for name in engines:
            if name == "onnx":
                continue
            v = median(speeds[(name, workload)])
            goal = ">= 1.0" if (name, workload) == ("torch", "single") else ""
            res.rows.append(
                Row(
                    "engines",
                    f"{name}, {workload}: audio s per wall s",
                    v,
                    "x",
                    "onnxruntime",
                    base,
                    v / base,
                    goal=goal,
                    met=(v / base >= 1.0) if goal else None,
                    note=f"RTF {1 / v:.3f}; median of {ROUNDS}",
                )
            )
    for name, times in setup.items():
        res.rows.append(
            Row(
                "engines",
                f"{name}: load + warm-up (in-process)",
                times["load_s"] + times["warmup_s"],
                "s",
                "onnxruntime",
                setup["onnx"]["load_s"] + setup["onnx"]["warmup_s"],
                (times["load_s"] + times["warmup_s"]) / (setup["onnx"]["load_s"] + setup["onnx"]["warmup_s"]),
                note=f"load {times['load_s']:.3f} s, warm-up {times['warmup_s']:.3f} s",
            )
        )
    res.details = {
        "speeds": {f"{k[0]}|{k[1]}": v for k, v in speeds.items()},
        "setup": setup,
        "threads": THREADS,
    }
    res.notes.append(
        "torch batches a request's sentences (sorted by length) in one forward pass; "
        "onnxruntime runs them one by one (Piper's export returns padded tails as noise)."
    )
    return res
