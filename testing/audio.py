"""Is this served audio the speech it should be? Compared with the engine's own output for the same text.

An RMS threshold passes white noise. Here the expected audio comes from an in-process engine built
from the packaged voice, run without noise (``noise_scale = noise_w = 0``), so the same text and
parameters give the same samples wherever they are synthesized. The served audio must then have
the expected length and follow the expected waveform:

- **float** (v2 and gRPC tensors): same length, max |error| <= ``FLOAT_MAX_ERROR``. The server runs
  the same graph with its own thread count, and oneDNN's convolutions sum in another order.
- **pcm16** (wav, pcm, flac): the same, plus half a 16-bit step of rounding.
- **lossy** (mp3, opus; opus also resampled to 24 kHz): an encoder keeps the spectrum, not each
  sample. The decoded length is within ``LOSSY_LENGTH_S`` of the expected duration (encoder delay and
  frame padding), and after aligning the two (best lag within ``LOSSY_MAX_LAG_S``) the waveforms
  correlate by at least ``LOSSY_MIN_CORRELATION``.

Every check also needs correlation >= ``MIN_CORRELATION``, so a bound on error alone cannot be met by
near-silence. White noise of the same length and level fails every check, and so does another
sentence (tests/system/test_audio_check.py).

Where the audio carries the voice's noise (the playground streams with it), `speech_problems` checks
it is speech of the expected length by measures that silence and white noise fail.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FLOAT_MAX_ERROR = 1e-3
PCM16_STEP = 1.0 / 32767
MIN_CORRELATION = 0.999
LOSSY_LENGTH_S = 0.05
LOSSY_MAX_LAG_S = 0.05
# Measured: mp3 0.9997, opus 0.996 for a sentence; white noise and another sentence under 0.1.
LOSSY_MIN_CORRELATION = 0.98

LOSSY_FORMATS = ("mp3", "opus")
PCM16_FORMATS = ("wav", "pcm", "flac")


class NotTheSpeech(AssertionError):
    """The served audio is not the expected speech; the message says which check failed and by how much."""


@dataclass(frozen=True)
class Match:
    """How close the served audio came: what the checks measured, for messages and reports."""

    length: int
    expected_length: int
    max_error: float | None
    correlation: float
    lag: int = 0


class ReferenceVoice:
    """The packaged default voice on an in-process torch engine (CPU, fp32, eager): the expected audio."""

    def __init__(self, voice_dir: Path, threads: int = 1) -> None:
        from predictor.engine.native import TorchEngine

        self.engine = TorchEngine(
            device="cpu", dtype="fp32", threads=threads, gpu_memory_fraction=0, compile=False
        )
        self.engine.load(voice_dir)
        self.sample_rate = self.engine.sample_rate

    def speak(self, text: str, length_scale: float | None = None) -> np.ndarray:
        """``text`` as the engine says it without noise: what v2, v1, events and `synth` must serve."""
        from predictor.engine.base import SynthesisParams

        params = SynthesisParams(length_scale=length_scale, noise_scale=0.0, noise_w=0.0)
        (audio,) = self.engine.synthesize([text], params)
        return audio

    def speech_route(
        self, text: str, speed: float = 1.0, max_segment_chars: int = 300, crossfade_ms: float = 50.0
    ) -> np.ndarray:
        """What `/v1/audio/speech` must serve from a voice without noise: normalized, segmented, crossfaded."""
        from predictor import text as texts
        from predictor.audio import crossfade

        segments = texts.split_segments(texts.normalize(text), max_segment_chars)
        spoken = [self.speak(s, length_scale=1.0 / speed) for s in segments]
        return crossfade.join(spoken, self.sample_rate, crossfade_ms)


def decode(data: bytes, fmt: str, sample_rate: int) -> tuple[np.ndarray, int]:
    """Encoded audio as float32 mono and its rate; ``sample_rate`` is for headerless pcm."""
    import soundfile

    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767, sample_rate
    audio, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return audio, int(rate)


def check_samples(served: np.ndarray, expected: np.ndarray, *, pcm16: bool = False) -> Match:
    """Sample by sample: same length, max |error| within FLOAT_MAX_ERROR (plus a 16-bit step), correlated."""
    served = np.asarray(served, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if len(served) != len(expected):
        raise NotTheSpeech(f"{len(served)} samples served, {len(expected)} expected")
    error = float(np.abs(served - expected).max()) if len(served) else 0.0
    match = Match(len(served), len(expected), error, _correlation(served, expected))
    bound = FLOAT_MAX_ERROR + (PCM16_STEP if pcm16 else 0.0)
    if error > bound or match.correlation < MIN_CORRELATION:
        raise NotTheSpeech(
            f"max |error| {error:.3g} (bound {bound:.3g}), correlation {match.correlation:.4f} "
            f"(at least {MIN_CORRELATION})"
        )
    return match


def check_lossy(served: np.ndarray, rate: int, expected: np.ndarray, expected_rate: int) -> Match:
    """Duration within LOSSY_LENGTH_S and, aligned, correlation >= LOSSY_MIN_CORRELATION."""
    served = np.asarray(served, dtype=np.float64)
    if rate != expected_rate:
        # Linear interpolation onto the served rate: independent of the server's own resampler, and
        # its error (above ~8 kHz) is far below what the correlation bound allows.
        times = np.arange(round(len(expected) * rate / expected_rate)) * (expected_rate / rate)
        expected = np.interp(times, np.arange(len(expected)), expected)
    expected = np.asarray(expected, dtype=np.float64)
    if abs(len(served) - len(expected)) > LOSSY_LENGTH_S * rate:
        raise NotTheSpeech(
            f"{len(served) / rate:.3f} s served, {len(expected) / rate:.3f} s expected (within {LOSSY_LENGTH_S} s)"
        )
    lag, correlation = _best_lag(served, expected, round(LOSSY_MAX_LAG_S * rate))
    if correlation < LOSSY_MIN_CORRELATION:
        raise NotTheSpeech(
            f"correlation {correlation:.4f} at the best lag {lag} (at least {LOSSY_MIN_CORRELATION})"
        )
    return Match(len(served), len(expected), None, correlation, lag)


def check_encoded(data: bytes, fmt: str, expected: np.ndarray, sample_rate: int) -> Match:
    """An encoded file or stream (any served format) against the expected float audio at ``sample_rate``."""
    audio, rate = decode(data, fmt, sample_rate)
    if fmt in LOSSY_FORMATS:
        return check_lossy(audio, rate, expected, sample_rate)
    if rate != sample_rate:
        raise NotTheSpeech(f"{fmt} at {rate} Hz, expected {sample_rate} Hz")
    return check_samples(audio, expected, pcm16=fmt in PCM16_FORMATS)


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    norm = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
    return float(np.dot(a, b) / norm) if norm > 0 else 0.0


def _best_lag(served: np.ndarray, expected: np.ndarray, max_lag: int) -> tuple[int, float]:
    """The shift of ``served`` (within ±max_lag samples) that lines it up with ``expected``, and the
    correlation there. The lag is the cross-correlation's peak (by FFT); the correlation is then exact."""
    n = len(served) + len(expected)
    size = 1 << (n - 1).bit_length()
    xcorr = np.fft.irfft(np.fft.rfft(served, size) * np.conj(np.fft.rfft(expected, size)), size)
    # xcorr[k] pairs served[i + k] with expected[i]; negative k wrap to the end.
    lags = np.arange(-max_lag, max_lag + 1)
    lag = int(lags[np.argmax(xcorr[lags % size])])
    a = served[lag:] if lag >= 0 else served
    b = expected if lag >= 0 else expected[-lag:]
    m = min(len(a), len(b))
    return lag, _correlation(a[:m], b[:m]) if m else 0.0


# --- noisy speech (the playground's streamed audio carries the voice's noise) --------------
def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if len(audio) else 0.0


def spectral_flatness(audio: np.ndarray, frame: int = 1024) -> float:
    """Median over voiced frames of geometric / arithmetic mean of the power spectrum.

    White noise scores about 0.56 (e^-γ) at any level; voiced speech, whose energy sits in harmonics
    and formants, well under 0.3. Frames quieter than 1 % of the loudest are pauses and are skipped.
    """
    n = len(audio) // frame
    if n == 0:
        return 1.0
    frames = audio[: n * frame].reshape(n, frame).astype(np.float64) * np.hanning(frame)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2 + 1e-12
    energy = power.sum(axis=1)
    loud = energy > 0.01 * energy.max()
    flatness = np.exp(np.mean(np.log(power[loud]), axis=1)) / np.mean(power[loud], axis=1)
    return float(np.median(flatness))


def speech_problems(audio: np.ndarray, rate: int, seconds: float, tolerance: float = 0.2) -> list[str]:
    """What keeps ``audio`` from being non-silent speech about ``seconds`` long (empty: nothing)."""
    problems = []
    length = len(audio) / rate
    if abs(length - seconds) > tolerance * seconds:
        problems.append(f"{length:.2f} s long, expected {seconds:.2f} s ± {tolerance:.0%}")
    if rms(audio) < 0.01:
        problems.append(f"silent (RMS {rms(audio):.4f})")
    if (flat := spectral_flatness(audio)) > 0.3:
        problems.append(f"spectrally flat like noise ({flat:.2f})")
    return problems
