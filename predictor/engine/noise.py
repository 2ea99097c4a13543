"""The noise both engines draw, so that a seed means the same audio on either.

VITS draws standard normal noise twice per sentence: the stochastic duration predictor's [2, T]
(T phonemes), then the prior's [inter_channels, F] (F frames, known only once the durations are).
Sentence k of a request with seed s draws both, in that order, from one numpy PCG64 stream seeded
s + k. numpy's stream is sequential (n values then m values are the first n + m of one draw), so the
onnx engine, which must feed its graph before F is known, can draw a longer buffer of which the
graph reads a prefix (engine/exported_graph.feed_noise), and gets exactly what the torch engine draws.

An unseeded request draws from a fresh seed, so its noise varies as Piper's own does.
"""

from __future__ import annotations

import secrets

import numpy as np

# Sentence k in a request is seeded seed + k; 2**62 leaves room for k and fits every int64 field.
SEED_LIMIT = 2**62


def stream(seed: int) -> np.random.Generator:
    """The noise of one sentence: standard normal float32 values, the duration predictor's first."""
    return np.random.default_rng(seed)


def fresh_seed() -> int:
    return secrets.randbelow(SEED_LIMIT)


def draw(rng: np.random.Generator, channels: int, length: int) -> np.ndarray:
    """[channels, length] float32 standard normal, row-major from the stream (as the graph reshapes it)."""
    return rng.standard_normal(channels * length, dtype=np.float32).reshape(channels, length)
