"""The noise both engines draw, so that a seed means the same audio on either.

VITS draws standard normal noise twice per sentence: the stochastic duration predictor's [2, T]
(T phonemes), then the prior's [inter_channels, F] (F frames, known only once the durations are).
Sentence k of item j (a text, or a segment of one) of an engine call with seed s draws both, in that
order, from one numpy PCG64 stream seeded s + j * ITEM_STRIDE + k (``sentence_seed``): an item's noise
depends on its place in the call, never on which other items share the call, so the serving pipeline,
which numbers a request's segments and calls the engine with several of them or one at a time, gets
the same audio either way (serving/pipeline.py). numpy's stream is sequential (n values then m values are the first n + m of one draw), so the
onnx engine, which must feed its graph before F is known, can draw a longer buffer of which the
graph reads a prefix (engine/exported_graph.feed_noise), and gets exactly what the torch engine draws.

An unseeded request draws from a fresh seed, so its noise varies as Piper's own does.
"""

from __future__ import annotations

import secrets

import numpy as np

# Seeds a request may give: below 2**62, so seed + j * ITEM_STRIDE + k fits every int64 field for any
# item and sentence count one request can reach.
SEED_LIMIT = 2**62
# Seeds apart of consecutive items: more sentences than any item (MAX_TEXT_CHARS) can hold.
ITEM_STRIDE = 2**24


def sentence_seed(seed: int, item: int, k: int) -> int:
    """The noise seed of sentence ``k`` of item ``item`` of a call seeded ``seed``."""
    return seed + item * ITEM_STRIDE + k


def stream(seed: int) -> np.random.Generator:
    """The noise of one sentence: standard normal float32 values, the duration predictor's first."""
    return np.random.default_rng(seed)


def fresh_seed() -> int:
    return secrets.randbelow(SEED_LIMIT)


def draw(rng: np.random.Generator, channels: int, length: int) -> np.ndarray:
    """[channels, length] float32 standard normal, row-major from the stream (as the graph reshapes it)."""
    return rng.standard_normal(channels * length, dtype=np.float32).reshape(channels, length)
