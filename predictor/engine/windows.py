"""Running the flow and decoding a latent in frame windows that join into exactly the whole run.

The HiFi-GAN generator is a stack of convolutions over time, so each output sample depends only on
latent frames within a fixed distance: its receptive field. A window of frames decoded together with
that many frames of context on each side (fewer at the ends of the latent, where the whole decode sees
zero padding too) therefore gives the same samples as the whole decode over the window's own frames;
only those samples (frames x hop_length) are kept. The flow (coupling layers of WaveNet convolutions,
flips of channels, nothing across the whole of time) is the same kind of stack, from the prior's
sample to the latent, so it runs in pieces the same way, one coupling layer at a time (flow_runs).
The contexts are computed from the voice's hyperparameters (vits.json), never assumed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from predictor.engine.vits_config import GENERATOR_PRE_POST_KERNEL, VitsConfig

# How far conv_pre (at frame rate) and conv_post (at the sample rate) reach on each side.
_PRE_POST_RADIUS = (GENERATOR_PRE_POST_KERNEL - 1) // 2


def decoder_context_frames(config: VitsConfig) -> int:
    """Latent frames on each side that an output sample of the generator can depend on (rounded up).

    Walks the generator's layers from its input: conv_pre at frame rate, then per upsampling stage the
    transposed convolution (reach ceil(k / u) of its inputs) and the widest chain of its residual
    blocks at the new rate, then conv_post at the sample rate. Each reach is converted to frames at the
    rate it acts on and summed; one frame more covers the rounding of the transposed convolutions.
    """
    return math.ceil(_PRE_POST_RADIUS + _generator_reach(config, 0)) + 1


def decoder_head_context(config: VitsConfig) -> int:
    """Latent frames on each side of a window that its samples depend on through the decoder head
    (rounded up, one more): the tail reads the head's outputs over the window and decoder_tail_context
    positions more on either side, and each of those reaches back through the first upsampling stage
    and conv_pre. A stream decodes a window so: the head over the window and this many frames more,
    the tail over the window's positions and its own context; the context is then the cheap head's,
    not a run of decoder_context_frames through the whole generator."""
    tail_reach = decoder_tail_context(config) / config.upsample_rates[0]
    return math.ceil(_PRE_POST_RADIUS + _stage_reach(config, 0) + tail_reach) + 1


def decoder_tail_context(config: VitsConfig) -> int:
    """Positions of the decoder tail's input (the first upsampling stage's output, upsample_rates[0]
    per frame) on each side that an output sample of the tail can depend on (rounded up, one more):
    the upsampling stages after the first and conv_post, walked as decoder_context_frames walks them."""
    return math.ceil(_generator_reach(config, 1)) + 1


def _generator_reach(config: VitsConfig, first_stage: int) -> float:
    """How far the generator's layers from upsampling stage ``first_stage`` on (its transposed
    convolution, residual blocks, then the later stages and conv_post) reach, in positions of that
    stage's input."""
    reach = 0.0
    rate = 1  # positions per input position of stage first_stage
    for stage in range(first_stage, len(config.upsample_rates)):
        reach += _stage_reach(config, stage) / rate
        rate *= config.upsample_rates[stage]
    return reach + _PRE_POST_RADIUS / rate  # conv_post, at the sample rate


def _stage_reach(config: VitsConfig, stage: int) -> float:
    """How far upsampling stage ``stage`` (its transposed convolution, then the widest chain of its
    residual blocks at the new rate) reaches, in positions of its input."""
    u, k = config.upsample_rates[stage], config.upsample_kernel_sizes[stage]
    widest = 0
    for rk, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True):
        radius = (rk - 1) // 2
        chain = sum(radius * d for d in dilations)
        if config.resblock == "1":
            chain += radius * len(dilations)  # each dilated conv is followed by an undilated one
        widest = max(widest, chain)
    return math.ceil(k / u) + widest / u


def coupling_context_frames(config: VitsConfig) -> int:
    """Frames on each side that a coupling layer's output can depend on in its input.

    A coupling layer changes half of the channels from the other half through its WaveNet: 1x1
    convolutions around flow_n_layers dilated convolutions, the i-th reaching (k - 1) / 2 * rate**i
    frames, one after the other, so their reaches add; the flips between the layers act on channels
    only. Whole frames, no rounding: the convolutions are symmetric and at frame rate.
    """
    radius = (config.flow_kernel_size - 1) // 2
    return sum(radius * config.flow_dilation_rate**i for i in range(config.flow_n_layers))


def flow_context_frames(config: VitsConfig) -> int:
    """Frames on each side that a latent frame can depend on in the prior's sample, through all the
    coupling layers (their reaches add), and one more: what a flow run in one part (a flow.onnx
    published before the flow was cut into its coupling layers) reads around a piece."""
    return config.flow_n_flows * coupling_context_frames(config) + 1


@dataclass(frozen=True)
class Window:
    """Decode frames [context_start, context_end); keep frames [start, end) of the result."""

    start: int
    end: int
    context_start: int
    context_end: int

    def keep(self, hop_length: int) -> slice:
        """The samples of the decoded context window that belong to this window."""
        offset = (self.start - self.context_start) * hop_length
        return slice(offset, offset + (self.end - self.start) * hop_length)


def plan(n_frames: int, first_frames: int, window_frames: int, context: int) -> list[Window]:
    """Windows covering [0, n_frames): the first of first_frames, then each at least window_frames
    and twice the one before (24, 192, 384, 768, ... by default).

    Each window after the first only has to be decoded while the audio before it plays, and that
    audio grows with every window, so the windows grow with it: a long sentence pays the context
    (twice the receptive field) a few times, not once every window_frames. A remainder shorter than
    half the window it would be joins the window before it instead of costing a context on its own;
    never a first window shorter than window_frames, which sets the time to first audio.
    """
    if n_frames <= 0:
        return []
    bounds = [0, min(first_frames, n_frames)]
    size = first_frames
    while bounds[-1] < n_frames:
        size = max(window_frames, 2 * size)
        bounds.append(min(bounds[-1] + size, n_frames))
    short_first = first_frames < window_frames
    if len(bounds) > (3 if short_first else 2) and bounds[-1] - bounds[-2] < size // 2:
        del bounds[-2]
    return [
        Window(a, b, max(0, a - context), min(n_frames, b + context)) for a, b in itertools.pairwise(bounds)
    ]


def flow_runs(n_frames: int, first_end: int, contexts: Sequence[int]) -> list[list[tuple[int, Window]]]:
    """How a stream runs the flow's stages (its coupling layers, or the whole flow as one stage) over
    [0, n_frames): in two pieces, the first making the latent's [0, first_end) (what the first decoder
    window reads), the second the rest; a piece is a list of (stage, window of that stage's output) in
    the order they run, each window reading its stage's input over ``contexts[stage]`` frames more on
    either side, all of which the stage before has made by then.

    The first audio waits for the first piece only. Each stage's second run redoes twice its context,
    so cut at every stage the flow redoes twice the sum of the contexts (64 frames of one coupling
    layer for this voice's four, an eighth of a 126-frame sentence's flow), not that many frames of
    the whole flow (four times as much). A rest shorter than three times the summed context runs in
    the first piece: splitting would cost more than it brings forward (docs/benchmarks.md, "The flow
    one coupling layer at a time").
    """
    if n_frames <= 0:
        return []
    if n_frames - first_end < 3 * sum(contexts):
        return [[(i, Window(0, n_frames, 0, n_frames)) for i in range(len(contexts))]]
    # The frames each stage's output must reach for the last stage to reach first_end.
    ends = [first_end] * len(contexts)
    for i in range(len(contexts) - 1, 0, -1):
        ends[i - 1] = min(n_frames, ends[i] + contexts[i])
    first = [
        (i, Window(0, e, 0, min(n_frames, e + c)))
        for i, (e, c) in enumerate(zip(ends, contexts, strict=True))
    ]
    rest = [
        (i, Window(e, n_frames, max(0, e - c), n_frames))
        for i, (e, c) in enumerate(zip(ends, contexts, strict=True))
        if e < n_frames
    ]
    return [first, rest]
