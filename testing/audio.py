"""Whether audio sounds like speech, by measures that silence and white noise fail."""

from __future__ import annotations

import numpy as np


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
