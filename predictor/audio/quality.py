"""Non-intrusive MOS estimates of a clip: Microsoft's DNSMOS (P.808 MOS and P.835 SIG/BAK/OVRL).

The models are the ONNX files the PyPI package `speechmos` (0.0.1.1, MIT) ships in its wheel, loaded
from the installed package and run with onnxruntime; nothing is downloaded. speechmos's own code
(`speechmos/dnsmos.py`, itself a copy of microsoft/DNS-Challenge `DNSMOS/dnsmos_local.py`) imports
librosa for one mel spectrogram, so the feature pipeline is re-implemented here with numpy, following
that file line by line:

- 16 kHz mono in [-1, 1]; a clip shorter than 9.01 s is tiled (appended to itself) until it is not;
- segments of 9.01 s (144,160 samples) every 1 s, `int(floor(seconds) - 9.01) + 1` of them;
- P.835 (`dnsmos_models/sig_bak_ovr.onnx`): the raw segment in, raw SIG/BAK/OVRL out, each mapped
  through the non-personalized polynomial fit (`get_polyfit_val`), averaged over segments;
- P.808 (`dnsmos_models/model_v8.onnx`): the segment minus its last 160 samples, as
  `librosa.feature.melspectrogram(n_fft=321, hop_length=160, n_mels=120)` with librosa 0.9.1's
  defaults (centred frames zero-padded by n_fft//2, periodic Hann window, power 2, Slaney mel scale
  and Slaney-normalized filters over rfftfreq bins), then `(power_to_db(ref=max, top_db=80) + 40) / 40`
  per segment: 900 frames x 120 bands; averaged over segments.

We score the first segment only by default (DEFAULT_MAX_SEGMENTS, for cost); `max_segments=None`
scores all of them and then equals speechmos's `dnsmos.run` (tests/unit/test_quality.py checks it
against testing/dnsmos_reference.json, which `make mos-reference` makes with speechmos itself).

Our voices speak at 22.05 kHz: the clip goes through the project's band-limited resampler first.
Bad input -- a non-finite sample, a clip under MIN_SECONDS, near-silence -- gives no score (None)
and counts in tts_mos_unscored_total{reason}; it never raises. Samples beyond [-1, 1] are clipped
first, as any PCM output of ours would clip them.

DNSMOS was trained on noisy and processed human speech (noise suppressors' outputs), not on TTS: its
scores rank degradations of a voice; they are not what listeners would give a synthetic voice.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictor.audio.resample import Resampler
from predictor.observability import metrics

SAMPLE_RATE = 16_000
SEGMENT_SECONDS = 9.01  # the models' input length (speechmos INPUT_LENGTH)
SEGMENT_SAMPLES = int(SEGMENT_SECONDS * SAMPLE_RATE)  # 144,160
HOP_SAMPLES = SAMPLE_RATE  # one segment per second of audio

# Shorter clips would be tiled more than nine times to fill one segment: the estimate would be of a
# loop, not of speech. One second holds a short sentence ("Hello there.") of the default voice.
MIN_SECONDS = 1.0
# A 9 s segment through both networks takes ~0.5-1 s of one core on our shared 2-CPU machine (bench
# quality: 0.13-0.23 s per audio second over 2-5 s sentences), and speechmos scores one segment per second of audio, so a 4 s sentence (tiled
# to 16 s) would cost 8 passes. We score
# the first segment only by default: the same first segment speechmos scores (tests check it), so
# one estimate costs one pass of each network whatever the clip's length.
DEFAULT_MAX_SEGMENTS = 1
# RMS below -60 dBFS is silence: the P.808 features are normalized to the loudest bin, so silence
# would be scored as whatever its dither looks like.
SILENCE_RMS = 1e-3

# P.808 mel spectrogram (speechmos DNSMOS.audio_melspec defaults).
_N_FFT = 321
_HOP = 160
_N_MELS = 120

# P.835 raw -> MOS, non-personalized (speechmos DNSMOS.get_polyfit_val).
_POLY_SIG = np.poly1d([-0.08397278, 1.22083953, 0.0052439])
_POLY_BAK = np.poly1d([-0.13166888, 1.60915514, -0.39604546])
_POLY_OVRL = np.poly1d([-0.06766283, 1.11546468, 0.04602535])

_MODELS_PACKAGE = "speechmos"
_P835_MODEL = "dnsmos_models/sig_bak_ovr.onnx"
_P808_MODEL = "dnsmos_models/model_v8.onnx"


class QualityUnavailable(Exception):
    """The DNSMOS model files are not installed (the `speechmos` package is missing)."""


@dataclass(frozen=True)
class Mos:
    """DNSMOS estimates of one clip on the 1-5 scale, each the mean over its 9 s segments."""

    p808: float
    sig: float
    bak: float
    ovrl: float
    segments: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_files() -> tuple[Path, Path]:
    """(P.835, P.808) ONNX paths inside the installed speechmos package; cheap (no import of it)."""
    spec = importlib.util.find_spec(_MODELS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise QualityUnavailable(
            "MOS estimates need the DNSMOS models from the speechmos package: pip install speechmos"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    paths = (root / _P835_MODEL, root / _P808_MODEL)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise QualityUnavailable(f"DNSMOS model files missing from the speechmos package: {missing}")
    return paths


# --- features ----------------------------------------------------------------------------------
def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa htk=False): linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log_step = math.log(6.4) / 27.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / log_step, mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    log_step = math.log(6.4) / 27.0
    return np.where(m >= 15.0, 1000.0 * np.exp(log_step * (m - 15.0)), m * (200.0 / 3))


@functools.lru_cache(maxsize=1)
def _mel_filters() -> np.ndarray:
    """librosa.filters.mel(sr=16000, n_fft=321, n_mels=120) as of librosa 0.9.1: [N_MELS, 161]."""
    fft_freqs = np.fft.rfftfreq(_N_FFT, 1.0 / SAMPLE_RATE)  # [161]
    mel_f = _mel_to_hz(
        np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(SAMPLE_RATE / 2)), _N_MELS + 2)
    )
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]  # [N_MELS+2, 161]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]  # Slaney: about constant energy per band
    return weights.astype(np.float32)


@functools.lru_cache(maxsize=1)
def _window() -> np.ndarray:
    # scipy.signal.get_window("hann", 321, fftbins=True): the periodic Hann window.
    n = np.arange(_N_FFT)
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * n / _N_FFT)).astype(np.float32)


def _p808_features(segments: np.ndarray) -> np.ndarray:
    """[S, 144160] segments -> [S, 900, 120] normalized log-mel frames (see the module docstring)."""
    y = segments[:, :-_HOP]  # [S, 144000]
    padded = np.pad(y, ((0, 0), (_N_FFT // 2, _N_FFT // 2)))  # centred frames, zero padding
    n_frames = 1 + (padded.shape[1] - _N_FFT) // _HOP  # 900
    frames = np.lib.stride_tricks.sliding_window_view(padded, _N_FFT, axis=1)[:, ::_HOP][:, :n_frames]
    power = np.abs(np.fft.rfft(frames * _window(), axis=2)) ** 2  # [S, 900, 161]
    mel = (power @ _mel_filters().T).astype(np.float64)  # [S, 900, 120]
    db = 10.0 * np.log10(np.maximum(1e-10, mel))
    ref = 10.0 * np.log10(np.maximum(1e-10, mel.max(axis=(1, 2), keepdims=True)))  # ref=np.max, per segment
    db -= ref
    db = np.maximum(db, db.max(axis=(1, 2), keepdims=True) - 80.0)  # top_db
    return ((db + 40.0) / 40.0).astype(np.float32)


def _segments(x: np.ndarray) -> np.ndarray:
    """16 kHz clip -> [S, 144160]: tiled to one segment's length, then a segment per second."""
    while len(x) < SEGMENT_SAMPLES:
        x = np.append(x, x)
    n = int(math.floor(len(x) / SAMPLE_RATE) - SEGMENT_SECONDS) + 1
    starts = [i * HOP_SAMPLES for i in range(n) if i * HOP_SAMPLES + SEGMENT_SAMPLES <= len(x)]
    return np.stack([x[s : s + SEGMENT_SAMPLES] for s in starts]).astype(np.float32)


# --- the estimator ---------------------------------------------------------------------------
class Estimator:
    """Both DNSMOS sessions, created once; `estimate` is safe to call from several threads."""

    def __init__(self, threads: int = 1, max_segments: int | None = DEFAULT_MAX_SEGMENTS):
        """`max_segments`: score the first N 9 s segments (None: all of them, as speechmos does)."""
        import onnxruntime as ort

        if max_segments is not None and max_segments < 1:
            raise ValueError(f"max_segments must be at least 1 or None, got {max_segments}")
        self.max_segments = max_segments

        p835, p808 = model_files()
        options = ort.SessionOptions()
        # One thread by default: the estimator shares the pod with the engine and must not take its cores.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        self._p835 = ort.InferenceSession(str(p835), options, providers=providers)
        self._p808 = ort.InferenceSession(str(p808), options, providers=providers)

    def estimate(self, audio: np.ndarray, sample_rate: int) -> Mos | None:
        """MOS of a mono clip at any sample rate, or None (counted by reason) when it cannot be scored."""
        x = np.asarray(audio, dtype=np.float32).reshape(-1)
        reason = unscorable(x, sample_rate)
        if reason is not None:
            metrics.MOS_UNSCORED.labels(reason).inc()
            return None
        if self.max_segments is not None:
            # N segments need at most 9.01 + N - 1 s; the 0.99 s kept beyond keeps the resampler's
            # edge (24 input samples) out of the last segment.
            x = x[: int((SEGMENT_SECONDS + self.max_segments) * sample_rate)]
        x = np.clip(x, -1.0, 1.0)
        if sample_rate != SAMPLE_RATE:
            x = np.clip(Resampler(sample_rate, SAMPLE_RATE).resample(x), -1.0, 1.0)
        segments = _segments(x)[: self.max_segments]  # [S, 144160]
        raw = self._p835.run(None, {"input_1": segments})[0]  # [S, 3]: SIG, BAK, OVRL before the fit
        p808 = self._p808.run(None, {"input_1": _p808_features(segments)})[0]  # [S, 1]
        return Mos(
            p808=float(np.mean(p808[:, 0])),
            sig=float(np.mean(_POLY_SIG(raw[:, 0]))),
            bak=float(np.mean(_POLY_BAK(raw[:, 1]))),
            ovrl=float(np.mean(_POLY_OVRL(raw[:, 2]))),
            segments=len(segments),
        )


def unscorable(x: np.ndarray, sample_rate: int) -> str | None:
    """Why a clip gets no score (a metric label), or None when it can be scored."""
    if sample_rate <= 0 or len(x) < MIN_SECONDS * sample_rate:
        return "too_short"
    if not np.isfinite(x).all():
        return "non_finite"
    if float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) < SILENCE_RMS:
        return "silence"
    return None


_shared: Estimator | None = None
_shared_lock = threading.Lock()


def shared_estimator() -> Estimator:
    """The process's one estimator (single-threaded sessions), created on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Estimator(threads=1)
        return _shared
