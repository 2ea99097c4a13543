"""Deliberately degraded copies of a clip, for calibrating the MOS estimator (tests and `bench quality`).

Each takes mono float audio and returns a new array of the same length and rate; seeded where random.
"""

from __future__ import annotations

import numpy as np

from predictor.audio.resample import Resampler


def add_noise(audio: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """White Gaussian noise at `snr_db` below the clip's own RMS."""
    x = np.asarray(audio, dtype=np.float64)
    rms = float(np.sqrt(np.mean(x**2)))
    noise = np.random.default_rng(seed).standard_normal(len(x)) * rms * 10 ** (-snr_db / 20)
    return (x + noise).astype(np.float32)


def low_pass(audio: np.ndarray, sample_rate: int, cutoff_hz: float) -> np.ndarray:
    """Everything above `cutoff_hz` removed (a brick wall in the frequency domain)."""
    x = np.asarray(audio, dtype=np.float64)
    spectrum = np.fft.rfft(x)
    spectrum[np.fft.rfftfreq(len(x), 1.0 / sample_rate) > cutoff_hz] = 0.0
    return np.fft.irfft(spectrum, n=len(x)).astype(np.float32)


def clip(audio: np.ndarray, overdrive_db: float) -> np.ndarray:
    """Amplified until its peak is `overdrive_db` over full scale, then hard-clipped at ±1, as an
    over-driven output stage would."""
    x = np.asarray(audio, dtype=np.float64)
    gain = 10 ** (overdrive_db / 20) / max(float(np.abs(x).max()), 1e-9)
    return np.clip(x * gain, -1.0, 1.0).astype(np.float32)


def narrowband(audio: np.ndarray, sample_rate: int, rate: int = 8000) -> np.ndarray:
    """Down to `rate` and back (telephone band: nothing above rate/2), with the project's resampler."""
    down = Resampler(sample_rate, rate).resample(np.asarray(audio, dtype=np.float32))
    up = Resampler(rate, sample_rate).resample(down)
    return up[: len(audio)].astype(np.float32)
