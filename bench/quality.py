"""MOS (DNSMOS) as a guard on speed-ups, and the estimator's calibration, in-process.

Every engine and mode synthesizes the same fixed sentences; each is scored with the estimator the
shadow records use (predictor.audio.quality, first 9 s segment, one thread) and reported as a
difference from the reference engine measured in the same run: onnxruntime on Piper's own export,
the voice as its authors ship it. A mode whose P.808 or OVRL mean drops by more than MAX_MOS_DROP
is "not met", whatever its speed.

Calibration: the spread of the estimates over repeated unseeded renditions of the same text (so a
reader can tell a real drop from noise), and what deliberately degraded copies of the reference's
audio score (added noise, low-pass, clipping, 8 kHz).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import THREADS, Row, Session, SuiteResult, log

# Each at least 1.5 s of speech: shorter clips are tiled to fill the estimator's 9 s window.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Serverless speech has to be fast from the very first request.",
    "At three o'clock on the twelfth of May, the canary received ten percent of the traffic.",
    "Scale to zero when idle, and answer quickly when called again.",
    "Numbers like forty two and three point one four are read out in full.",
    "A longer sentence, with commas, clauses, and pauses, tests the duration predictor on varied rhythm.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "Please leave your message after the tone, and we will call you back as soon as we can.",
]
RENDITIONS = 2  # per sentence and mode: means over 16 clips
CALIBRATION_RENDITIONS = 5
MAX_MOS_DROP = 0.1
FIELDS = {"p808": "MOS P.808", "ovrl": "MOS P.835 OVRL"}


def _engine(model_dir: Path, **overrides: Any) -> Any:
    from predictor.config import load_settings
    from predictor.engine.factory import create

    settings = load_settings(cpu_threads=THREADS, **overrides)
    engine = create(settings)
    engine.load(model_dir)
    engine.warmup(settings.warmup_text)
    return engine


Synth = Callable[[str, Any], np.ndarray]  # (text, SynthesisParams) -> audio


def _whole(engine: Any) -> Synth:
    return lambda text, params: engine.synthesize([text], params)[0]


def _chunked(engine: Any) -> Synth:
    """Decoded window by window as the streamed routes do (STREAM_*_WINDOW_FRAMES defaults), joined."""
    from predictor.config import load_settings
    from predictor.engine.base import StreamWindows

    s = load_settings()
    windows = StreamWindows(s.stream_first_window_frames, s.stream_window_frames)
    return lambda text, params: np.concatenate([a for a, _ in engine.stream(text, params, windows)])


def _modes(model_dir: Path) -> tuple[dict[str, Synth], int]:
    """Reference first. On a CUDA machine the GPU's reduced-precision decoders are added."""
    import torch

    onnx, torch_fp32 = _engine(model_dir, engine="onnx"), _engine(model_dir, engine="torch")
    modes = {
        "onnx fp32 (reference)": _whole(onnx),
        "onnx fp32, chunked decoding": _chunked(onnx),
        "torch fp32": _whole(torch_fp32),
        "torch fp32, chunked decoding": _chunked(torch_fp32),
        "torch bf16 decoder": _whole(_engine(model_dir, engine="torch", dtype="bf16")),
    }
    if torch.cuda.is_available():
        for dtype in ("fp32", "bf16", "fp16"):
            modes[f"torch cuda {dtype}"] = _whole(
                _engine(model_dir, engine="torch", device="cuda", dtype=dtype)
            )
    return modes, onnx.sample_rate


def _mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and its 95 % normal-approximation half-width (t is within 7 % of 1.96 at n = 16)."""
    if len(xs) < 2:
        return (xs[0] if xs else math.nan), math.nan
    return statistics.fmean(xs), 1.96 * statistics.stdev(xs) / math.sqrt(len(xs))


def _score(estimator: Any, audio: np.ndarray, sr: int) -> dict[str, float] | None:
    mos = estimator.estimate(audio, sr)
    return None if mos is None else {"p808": mos.p808, "ovrl": mos.ovrl}


def run(session: Session) -> SuiteResult:
    from predictor.artifact.fetch import fetch
    from predictor.audio import quality
    from predictor.engine.base import SynthesisParams
    from testing import degrade

    res = SuiteResult()
    model_dir = session.path("model")
    fetch(session.voice, model_dir)
    estimator = quality.Estimator(threads=1)  # as on the shadow records' thread
    modes, sr = _modes(model_dir)
    reference = next(iter(modes))

    # --- engines and modes: speed and MOS on the same clips --------------------------------------
    scores: dict[str, dict[str, list[float]]] = {m: {f: [] for f in FIELDS} for m in modes}
    synth_s: dict[str, float] = dict.fromkeys(modes, 0.0)
    audio_s: dict[str, float] = dict.fromkeys(modes, 0.0)
    mos_s, mos_audio_s = 0.0, 0.0
    reference_clips: list[np.ndarray] = []
    for r in range(RENDITIONS):
        for i, text in enumerate(SENTENCES):
            for name, synth in modes.items():
                # Every mode shares a seed per clip (engine/noise.py), so modes differ by precision
                # and engine alone, not by their noise.
                seed = 1000 * r + i
                start = time.perf_counter()
                audio = synth(text, SynthesisParams(seed=seed))
                synth_s[name] += time.perf_counter() - start
                audio_s[name] += len(audio) / sr
                start = time.perf_counter()
                s = _score(estimator, audio, sr)
                mos_s += time.perf_counter() - start
                mos_audio_s += len(audio) / sr
                if s is not None:
                    for f in FIELDS:
                        scores[name][f].append(s[f])
                if name == reference:
                    reference_clips.append(audio)
        log(f"quality: rendition {r + 1}/{RENDITIONS} of {len(SENTENCES)} sentences in {len(modes)} modes")

    base_speed = audio_s[reference] / synth_s[reference]
    base = {f: _mean_ci(scores[reference][f]) for f in FIELDS}
    for name in modes:
        speed = audio_s[name] / synth_s[name]
        means = {f: _mean_ci(scores[name][f]) for f in FIELDS}
        drops = {f: base[f][0] - means[f][0] for f in FIELDS}
        ok = all(d <= MAX_MOS_DROP for d in drops.values())
        mos_note = ", ".join(f"{FIELDS[f]} {means[f][0]:.2f} ({-drops[f]:+.2f})" for f in FIELDS)
        if name != reference:
            res.rows.append(
                Row(
                    "quality",
                    f"{name}: audio s per wall s",
                    speed,
                    "x",
                    reference,
                    base_speed,
                    speed / base_speed,
                    goal=f"MOS drop <= {MAX_MOS_DROP}",
                    met=ok,
                    note=f"{mos_note}; a speed-up counts only with its MOS held",
                )
            )
        for f, label in FIELDS.items():
            mean, ci = means[f]
            res.rows.append(
                Row(
                    "quality",
                    f"{name}: {label}",
                    mean,
                    "MOS",
                    reference if name != reference else "",
                    base[f][0] if name != reference else None,
                    -drops[f] if name != reference else None,
                    ratio_label="MOS diff",
                    goal=f">= -{MAX_MOS_DROP}" if name != reference else "",
                    met=(drops[f] <= MAX_MOS_DROP) if name != reference else None,
                    note=f"± {ci:.2f} (95 %), {len(scores[name][f])} clips; speed {speed:.2f} audio s per wall s",
                )
            )

    # --- cost of an estimate ---------------------------------------------------------------------
    ref_cost = synth_s[reference] / audio_s[reference]
    res.rows.append(
        Row(
            "quality",
            "MOS estimate (1 thread): wall s per audio s",
            mos_s / mos_audio_s,
            "s",
            f"{reference} synthesis ({THREADS} threads)",
            ref_cost,
            (mos_s / mos_audio_s) / ref_cost,
            note=f"{mos_s:.1f} s for {mos_audio_s:.1f} s of audio; one 9 s segment per clip",
        )
    )

    # --- calibration: renditions ----------------------------------------------------------------
    torch_fp32 = modes["torch fp32"]
    per_text: dict[str, list[list[float]]] = {f: [] for f in FIELDS}
    for i, text in enumerate(SENTENCES):
        runs: dict[str, list[float]] = {f: [] for f in FIELDS}
        for _ in range(CALIBRATION_RENDITIONS):
            audio = torch_fp32(text, SynthesisParams(seed=None))
            s = _score(estimator, audio, sr)
            if s is not None:
                for f in FIELDS:
                    runs[f].append(s[f])
        for f in FIELDS:
            per_text[f].append(runs[f])
        log(f"quality: calibration sentence {i + 1}/{len(SENTENCES)}")
    calibration: dict[str, Any] = {}
    for f, label in FIELDS.items():
        within = [statistics.stdev(xs) for xs in per_text[f] if len(xs) >= 2]
        sd = statistics.fmean(within) if within else math.nan
        # Two independent sets of one rendition per sentence: their mean difference spreads by
        # sd * sqrt(2 / n); what an A/A comparison of this many texts would show by chance.
        aa = sd * math.sqrt(2 / len(SENTENCES))
        calibration[f] = {"within_text_sd": sd, "aa_mean_diff_sd": aa, "scores": per_text[f]}
        res.rows.append(
            Row(
                "quality",
                f"calibration: {label} spread over {CALIBRATION_RENDITIONS} unseeded renditions",
                sd,
                "MOS",
                note=f"sd within a text (mean over {len(SENTENCES)} texts); "
                f"an A/A mean difference over {len(SENTENCES)} texts spreads by {aa:.3f}",
            )
        )

    # --- calibration: degraded copies of the reference's clips ----------------------------------
    degradations = {
        "white noise, 20 dB SNR": lambda x: degrade.add_noise(x, 20),
        "white noise, 10 dB SNR": lambda x: degrade.add_noise(x, 10),
        "low-pass 4 kHz": lambda x: degrade.low_pass(x, sr, 4000),
        "low-pass 2 kHz": lambda x: degrade.low_pass(x, sr, 2000),
        "clipped, 6 dB over full scale": lambda x: degrade.clip(x, 6),
        "clipped, 12 dB over full scale": lambda x: degrade.clip(x, 12),
        "8 kHz (telephone band)": lambda x: degrade.narrowband(x, sr, 8000),
    }
    clips = reference_clips[: len(SENTENCES)]
    clean = [_score(estimator, x, sr) for x in clips]
    degraded: dict[str, Any] = {}
    for name, fn in degradations.items():
        diffs: dict[str, list[float]] = {f: [] for f in FIELDS}
        for x, c in zip(clips, clean, strict=True):
            d = _score(estimator, fn(x), sr)
            if c is not None and d is not None:
                for f in FIELDS:
                    diffs[f].append(d[f] - c[f])
        degraded[name] = diffs
        for f, label in FIELDS.items():
            mean, ci = _mean_ci(diffs[f])
            clean_mean = statistics.fmean(c[f] for c in clean if c is not None)
            res.rows.append(
                Row(
                    "quality",
                    f"calibration: {name}: {label}",
                    clean_mean + mean,
                    "MOS",
                    "clean",
                    clean_mean,
                    mean,
                    ratio_label="MOS diff",
                    note=f"± {ci:.2f} (95 %), {len(diffs[f])} clips",
                )
            )
        log(f"quality: degraded '{name}'")

    res.details = {
        "sentences": SENTENCES,
        "renditions": RENDITIONS,
        "scores": scores,
        "synthesis_s": synth_s,
        "audio_s": audio_s,
        "mos_cost_s_per_audio_s": mos_s / mos_audio_s,
        "calibration": calibration,
        "degraded_minus_clean": degraded,
    }
    res.notes.append(
        "DNSMOS was trained on noisy and processed human speech, not TTS: the figures rank changes of "
        "one voice; they are not what listeners would give it. Differences are against the reference "
        "engine in this run; every mode shares the seed of each clip (the figures in docs/canary.md were "
        "taken before onnxruntime could be seeded)."
    )
    return res
