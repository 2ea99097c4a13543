"""A compact audio fingerprint (pooled mel cepstrum) and the mel-cepstral distortion between two."""

from __future__ import annotations

import functools
import math

import numpy as np

# --- the audio fingerprint ---------------------------------------------------------------------
# Analysis at 22.05 kHz: 46 ms windows every 11.6 ms, the usual speech front end.
# Audio beyond this is left out of the fingerprint, so a 50,000-character chapter on the speech route
# does not hold an hour of audio in memory until its record is written.
FINGERPRINT_MAX_SECONDS = 60.0
N_FFT = 1024


HOP = 256


N_MELS = 40


N_CEPS = 13  # c0 (level) + 12 shape coefficients: what MCD is conventionally computed over


FRAMES = 32  # time slices after pooling: ~2.5 KB of JSON per record whatever the audio's length


# 10/ln(10) * sqrt(2): turns a Euclidean distance between natural-log cepstra into decibels.
_MCD_DB = 10.0 / math.log(10.0) * math.sqrt(2.0)


@functools.lru_cache(maxsize=4)
def _mel_filters(sample_rate: int) -> np.ndarray:
    """Triangular HTK-mel filters, [N_MELS, N_FFT//2 + 1], each summing to 1 (band means, not sums)."""

    def mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    bins = np.fft.rfftfreq(N_FFT, 1.0 / sample_rate)  # [F]
    edges = hz(np.linspace(mel(np.array(0.0)), mel(np.array(sample_rate / 2.0)), N_MELS + 2))  # [N_MELS+2]
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]  # each [N_MELS, 1]
    tri = np.maximum(0.0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)))  # [N_MELS, F]
    # The lowest bands are narrower than one FFT bin; give them their nearest bin rather than nothing.
    empty = tri.sum(axis=1) == 0
    tri[empty, np.abs(bins[None, :] - mid[empty]).argmin(axis=1)] = 1.0
    return (tri / tri.sum(axis=1, keepdims=True)).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _dct() -> np.ndarray:
    """DCT-II rows 0..N_CEPS-1 over the mel bands scaled as a real cepstrum, [N_CEPS, N_MELS].

    c_k = (1/M) sum_m x_m cos(pi k (m + 1/2) / M): the inverse DFT of a symmetric log spectrum, the
    scale MCD's dB constant was defined on (an orthonormal DCT would read sqrt(2M) = 9x larger).
    """
    k = np.arange(N_CEPS)[:, None]
    m = np.arange(N_MELS)[None, :]
    return (np.cos(np.pi * k * (m + 0.5) / N_MELS) / N_MELS).astype(np.float32)


def _pool(x: np.ndarray, slices: int) -> np.ndarray:
    """Mean of `x` [n, B] over `slices` contiguous, near-equal runs of rows -> [slices, B].

    Time-normalizing replaces the DTW alignment of a textbook MCD: both revisions spoke the same text,
    so slice i of each covers the same part of the utterance, and a tempo change shows up in the
    duration ratio instead of smearing the spectral distance.
    """
    n = len(x)
    edges = np.linspace(0, n, slices + 1)
    starts = np.floor(edges[:-1]).astype(int)  # [slices]
    ends = np.minimum(n, np.maximum(starts + 1, np.ceil(edges[1:]).astype(int)))  # [slices]; >= 1 row each
    csum = np.concatenate([np.zeros((1, x.shape[1]), x.dtype), np.cumsum(x, axis=0)])  # [n+1, B]
    return (csum[ends] - csum[starts]) / (ends - starts)[:, None]


def fingerprint(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """A time-normalized mel cepstrum of mono float audio, [FRAMES, N_CEPS] float32."""
    x = np.asarray(audio, dtype=np.float32)[: int(FINGERPRINT_MAX_SECONDS * sample_rate)]
    if len(x) < N_FFT:
        x = np.pad(x, (0, N_FFT - len(x)))
    n = 1 + (len(x) - N_FFT) // HOP
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP][:n]  # [n, N_FFT] (a view)
    window = np.hanning(N_FFT).astype(np.float32)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2  # [n, N_FFT//2+1]
    mel = power @ _mel_filters(sample_rate).T  # [n, N_MELS]
    # Natural log of the amplitude (half the log power), the convention MCD's dB constant assumes.
    # The floor, 60 dB below the loudest band, makes pauses flat: the log of near-silence is noise
    # that would otherwise dominate the distance between two renditions of the same text.
    floor = max(float(mel.max()), 1e-20) * 1e-6
    log_amp = 0.5 * np.log(np.maximum(mel, floor))  # [n, N_MELS]
    return (_pool(log_amp, FRAMES) @ _dct().T).astype(np.float32)  # [FRAMES, N_CEPS]


def mel_cepstral_distortion(a: np.ndarray, b: np.ndarray) -> float:
    """Mean MCD in dB between two fingerprints [FRAMES, N_CEPS]; c0 (overall level) is left out."""
    diff = (
        np.asarray(a, dtype=np.float64)[:, 1:] - np.asarray(b, dtype=np.float64)[:, 1:]
    )  # [FRAMES, N_CEPS-1]
    return float(np.mean(_MCD_DB * np.sqrt(np.sum(diff**2, axis=1))))
