"""Piper's VITS voice as a plain PyTorch inference graph.

This is the network Piper exports to ONNX (VITS, Kim et al. 2021, "Conditional Variational Autoencoder
with Adversarial Learning for End-to-End Text-to-Speech"), written out module by module with the
names of the VITS/Piper code so that the exported weights load by name. Only the inference path
exists: no posterior encoder, no discriminator, the normalizing flows only run in reverse, and there
is no dropout.

    phoneme ids ─► TextEncoder ─► (x, m_p, logs_p)
                        x ─► StochasticDurationPredictor (reverse, noise_w) ─► log durations
    ceil(exp(logw) * length_scale) ─► monotonic alignment ─► m_p, logs_p expanded to frames
    z_p = m_p + ε·exp(logs_p)·noise_scale ─► ResidualCouplingBlock (reverse) ─► z ─► Generator ─► audio

Differences from the exported graph, all deliberate:
  * a padded batch is exact: the generator masks each convolution's input past every item's own
    length, so an item's audio equals the audio of that item run alone (the ONNX graph lets the padded
    tail of one item leak into the last samples of shorter ones, and returns that tail as noise);
  * noise comes from torch or numpy (seedable, per-item generators; engine/noise.py's numpy stream is
    the one the onnx engine feeds its graph) or is injected by the caller;
  * the text encoder, the duration path and the flow always run in fp32 (a duration 0.005 away from
    an integer flips its ceil and shifts every later frame; the flow is ~15% of the work but in bf16
    it drops the worst-case correlation with fp32 audio from 0.998 to 0.987); only the HiFi-GAN
    generator, most of the work, may run in a lower precision (``decoder_dtype``).

Shapes: B batch, T phonemes, F frames (hop_length samples each), S = F * hop_length samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from predictor.engine.vits_config import GENERATOR_PRE_POST_KERNEL, VitsConfig

# HiFi-GAN's leaky ReLU slope inside the generator and its residual blocks.
LRELU_SLOPE = 0.1
# The generator's last activation is a bare F.leaky_relu(x): torch's default slope, not LRELU_SLOPE.
FINAL_LRELU_SLOPE = 0.01
# VITS masks attention scores with -1e4 rather than -inf (fp32 exp underflows to exactly 0 anyway).
ATTN_MASK_VALUE = -1e4
# VITS' channel LayerNorm epsilon (torch's default, as the exported graph shows).
LAYER_NORM_EPS = 1e-5
# searchsorted nudges the last bin edge up so an input equal to the upper bound lands in the last bin.
SPLINE_SEARCH_EPS = 1e-6


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """[B] lengths -> [B, max_length] bool, True inside each item."""
    positions = torch.arange(max_length, dtype=lengths.dtype, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


def get_padding(kernel_size: int, dilation: int = 1) -> int:
    """'Same' padding of an odd dilated kernel."""
    return (kernel_size * dilation - dilation) // 2


# ---------------------------------------------------------------------------------------------------
# Text encoder


class LayerNorm(nn.Module):
    """LayerNorm over the channel axis of [B, C, T] (VITS keeps time last everywhere)."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, -1)  # [B, T, C]
        x = F.layer_norm(x, (self.channels,), self.gamma, self.beta, LAYER_NORM_EPS)
        return x.transpose(1, -1)


class MultiHeadAttention(nn.Module):
    """Self-attention with Shaw-style relative position embeddings on keys and values (window ±w)."""

    def __init__(self, channels: int, n_heads: int, window_size: int, heads_share: bool):
        super().__init__()
        assert channels % n_heads == 0
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        n_heads_rel = 1 if heads_share else n_heads
        # One embedding per relative offset -w..w.
        self.emb_rel_k = nn.Parameter(torch.zeros(n_heads_rel, 2 * window_size + 1, self.k_channels))
        self.emb_rel_v = nn.Parameter(torch.zeros(n_heads_rel, 2 * window_size + 1, self.k_channels))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], attn_mask: [B, 1, T, T]
        b, c, t = x.shape
        # [B, C, T] -> [B, H, T, Dk]
        q = self.conv_q(x).view(b, self.n_heads, self.k_channels, t).transpose(2, 3)
        k = self.conv_k(x).view(b, self.n_heads, self.k_channels, t).transpose(2, 3)
        v = self.conv_v(x).view(b, self.n_heads, self.k_channels, t).transpose(2, 3)

        q = q / math.sqrt(self.k_channels)
        scores = torch.matmul(q, k.transpose(-2, -1))  # [B, H, T, T]
        # Only offsets -w..w have embeddings: the queries meet those 2w+1 alone (VITS pads them with
        # zeros to 2T-1 offsets first; the same sums, exported_graph.banded_attention does it on onnx).
        rel_logits = torch.matmul(q, self.emb_rel_k.unsqueeze(0).transpose(-2, -1))  # [B, H, T, 2w+1]
        scores = scores + self._band_to_absolute(rel_logits)
        scores = scores.masked_fill(attn_mask == 0, ATTN_MASK_VALUE)
        p_attn = F.softmax(scores, dim=-1)  # [B, H, T, T]

        out = torch.matmul(p_attn, v)  # [B, H, T, Dk]
        out = out + torch.matmul(self._absolute_to_band(p_attn), self.emb_rel_v.unsqueeze(0))
        out = out.transpose(2, 3).contiguous().view(b, c, t)
        return self.conv_o(out)

    def _band_to_absolute(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, T, 2w+1] indexed by offset -w..w -> [B, H, T, T] indexed by key position, zeros
        outside the band (row i moved i places right: pad, flatten, drop T, view)."""
        b, h, t, band = x.shape
        x = F.pad(x, (0, t))  # [B, H, T, T+2w+1]
        x = x.reshape(b, h, t * (t + band))[:, :, : t * (t + band - 1)]
        return x.reshape(b, h, t, t + band - 1)[:, :, :, self.window_size : self.window_size + t]

    def _absolute_to_band(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, T, T] indexed by key position -> [B, H, T, 2w+1] indexed by offset -w..w, zeros
        where the offset falls outside the sentence (row i moved i places left)."""
        b, h, t, _ = x.shape
        w = self.window_size
        x = F.pad(x, (w, w))  # [B, H, T, T+2w]
        x = F.pad(x.reshape(b, h, t * (t + 2 * w)), (0, t))  # [B, H, T * (T+2w+1)]
        return x.view(b, h, t, t + 2 * w + 1)[:, :, :, : 2 * w + 1]


class FFN(nn.Module):
    """Two 'same'-padded convolutions with ReLU; padded positions are zeroed before each conv."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)
        # VITS pads (k-1)//2 left and k//2 right (equal for the odd kernels Piper uses).
        self.padding = ((kernel_size - 1) // 2, kernel_size // 2)

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        x = self.conv_1(F.pad(x * x_mask, self.padding))
        x = torch.relu(x)
        x = self.conv_2(F.pad(x * x_mask, self.padding))
        return x * x_mask


class Encoder(nn.Module):
    """Post-norm transformer: attention and FFN blocks, each followed by residual + LayerNorm."""

    def __init__(self, config: VitsConfig):
        super().__init__()
        c = config
        self.attn_layers = nn.ModuleList(
            MultiHeadAttention(c.hidden_channels, c.n_heads, c.window_size, c.heads_share)
            for _ in range(c.n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(LayerNorm(c.hidden_channels) for _ in range(c.n_layers))
        self.ffn_layers = nn.ModuleList(
            FFN(c.hidden_channels, c.filter_channels, c.kernel_size) for _ in range(c.n_layers)
        )
        self.norm_layers_2 = nn.ModuleList(LayerNorm(c.hidden_channels) for _ in range(c.n_layers))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T], x_mask: [B, 1, T]
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)  # [B, 1, T, T]
        x = x * x_mask
        for attn, norm_1, ffn, norm_2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2, strict=False
        ):
            x = norm_1(x + attn(x, attn_mask))
            x = norm_2(x + ffn(x, x_mask))
        return x * x_mask


class TextEncoder(nn.Module):
    """Phoneme ids -> hidden states x and the prior's per-phoneme mean m_p and log-std logs_p."""

    def __init__(self, config: VitsConfig):
        super().__init__()
        self.hidden_channels = config.hidden_channels
        self.inter_channels = config.inter_channels
        self.emb = nn.Embedding(config.n_vocab, config.hidden_channels)
        self.encoder = Encoder(config)
        self.proj = nn.Conv1d(config.hidden_channels, 2 * config.inter_channels, 1)

    def forward(
        self, ids: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # ids: [B, T] long, lengths: [B] long
        # The embedding was trained with a sqrt(d) scale, as in the Transformer paper.
        x = self.emb(ids) * math.sqrt(self.hidden_channels)  # [B, T, C]
        x = x.transpose(1, -1)  # [B, C, T]
        x_mask = sequence_mask(lengths, ids.size(1)).unsqueeze(1).to(x.dtype)  # [B, 1, T]
        x = self.encoder(x * x_mask, x_mask)
        stats = self.proj(x) * x_mask  # [B, 2*inter, T]
        m_p, logs_p = torch.split(stats, self.inter_channels, dim=1)
        return x, m_p, logs_p, x_mask


# ---------------------------------------------------------------------------------------------------
# Stochastic duration predictor


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions (dilation kernel_size**i), LayerNorm + GELU, residual."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int):
        super().__init__()
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            self.convs_sep.append(
                nn.Conv1d(
                    channels,
                    channels,
                    kernel_size,
                    groups=channels,
                    dilation=dilation,
                    padding=get_padding(kernel_size, dilation),
                )
            )
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(LayerNorm(channels))
            self.norms_2.append(LayerNorm(channels))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, C, T]; g: conditioning of the same shape, added once
        if g is not None:
            x = x + g
        for conv_sep, conv_1x1, norm_1, norm_2 in zip(
            self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2, strict=False
        ):
            y = F.gelu(norm_1(conv_sep(x * x_mask)))
            y = F.gelu(norm_2(conv_1x1(y)))
            x = x + y
        return x * x_mask


def rational_quadratic_spline_inverse(
    inputs: torch.Tensor,
    unnormalized_widths: torch.Tensor,
    unnormalized_heights: torch.Tensor,
    unnormalized_derivatives: torch.Tensor,
    tail_bound: float,
    min_bin_width: float,
    min_bin_height: float,
    min_derivative: float,
) -> torch.Tensor:
    """Inverse of VITS' unconstrained rational-quadratic spline with linear tails (Durkan et al. 2019).

    inputs: [...]; widths, heights: [..., K]; derivatives: [..., K-1] (interior knots).
    Inside [-tail_bound, tail_bound] the spline is inverted; outside it is the identity. VITS gathers
    the inside elements with boolean indexing; here every element is computed on clamped inputs and
    the tails are selected with torch.where, which is elementwise the same and keeps shapes static.
    """
    left, right, bottom, top = -tail_bound, tail_bound, -tail_bound, tail_bound
    num_bins = unnormalized_widths.shape[-1]
    inside = (inputs >= left) & (inputs <= right)
    x = inputs.clamp(left, right)

    # Linear tails: the outer knots get derivative 1 (softplus(c) + min_derivative == 1).
    boundary = math.log(math.exp(1 - min_derivative) - 1)
    unnormalized_derivatives = F.pad(unnormalized_derivatives, (1, 1), value=boundary)  # [..., K+1]

    def knots(
        unnormalized: torch.Tensor, min_size: float, low: float, high: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = F.softmax(unnormalized, dim=-1)
        sizes = min_size + (1 - min_size * num_bins) * sizes
        cum = torch.cumsum(sizes, dim=-1)
        cum = (high - low) * cum + low  # [..., K]
        # Knots K+1: pin both ends exactly to the interval (as VITS does after the cumsum).
        cum = torch.cat(
            [torch.full_like(cum[..., :1], low), cum[..., :-1], torch.full_like(cum[..., :1], high)], -1
        )
        return cum, cum[..., 1:] - cum[..., :-1]

    cumwidths, widths = knots(unnormalized_widths, min_bin_width, left, right)
    cumheights, heights = knots(unnormalized_heights, min_bin_height, bottom, top)
    derivatives = min_derivative + F.softplus(unnormalized_derivatives)

    # Inverse: find the bin on the output (height) axis.
    search = torch.cat([cumheights[..., :-1], cumheights[..., -1:] + SPLINE_SEARCH_EPS], -1)
    bin_idx = (torch.sum(x.unsqueeze(-1) >= search, dim=-1) - 1).unsqueeze(-1)

    def at(t: torch.Tensor) -> torch.Tensor:
        return t.gather(-1, bin_idx).squeeze(-1)

    input_cumwidths = at(cumwidths)
    input_bin_widths = at(widths)
    input_cumheights = at(cumheights)
    delta = heights / widths
    input_delta = at(delta)
    input_derivatives = at(derivatives)
    input_derivatives_plus_one = at(derivatives[..., 1:])
    input_heights = at(heights)

    # Solve the bin's rational quadratic for theta in [0, 1] (the numerically stable root).
    dy = x - input_cumheights
    slope_sum = input_derivatives + input_derivatives_plus_one - 2 * input_delta
    a = dy * slope_sum + input_heights * (input_delta - input_derivatives)
    b = input_heights * input_derivatives - dy * slope_sum
    c = -input_delta * dy
    discriminant = b.pow(2) - 4 * a * c
    root = (2 * c) / (-b - torch.sqrt(discriminant))
    outputs = root * input_bin_widths + input_cumwidths
    return torch.where(inside, outputs, inputs)


class ElementwiseAffine(nn.Module):
    """y = m + exp(logs) * x per channel; reverse: x = (y - m) * exp(-logs)."""

    def __init__(self, channels: int):
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return (x - self.m) * torch.exp(-self.logs) * x_mask


class Flip(nn.Module):
    """Reverse the channel order so the next coupling layer transforms the other half."""

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return torch.flip(x, [1])


class UnusedFlow(nn.Module):
    """Placeholder for dp.flows.1: VITS drops that spline flow in reverse ("a useless vflow"), so its
    weights never reach the exported graph; it holds the slot so later flows keep their indices."""


class ConvFlow(nn.Module):
    """Neural spline coupling: half the channels, through DDSConv, parameterize a spline on the other half."""

    def __init__(
        self, in_channels: int, filter_channels: int, kernel_size: int, n_layers: int, config: VitsConfig
    ):
        super().__init__()
        self.half_channels = in_channels // 2
        self.filter_channels = filter_channels
        self.num_bins = config.dp_num_bins
        self.config = config
        self.pre = nn.Conv1d(self.half_channels, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers)
        # Per channel: K widths, K heights, K-1 interior derivatives.
        self.proj = nn.Conv1d(filter_channels, self.half_channels * (3 * self.num_bins - 1), 1)

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, 2*half, T], g: [B, filter, T]
        x0, x1 = torch.split(x, [self.half_channels] * 2, 1)
        h = self.pre(x0)
        h = self.convs(h, x_mask, g=g)
        h = self.proj(h) * x_mask  # [B, half*(3K-1), T]
        b, c, t = x0.shape
        h = h.reshape(b, c, -1, t).permute(0, 1, 3, 2)  # [B, half, T, 3K-1]
        k = self.num_bins
        # Widths and heights are scaled like attention logits so the softmax starts near uniform.
        scale = math.sqrt(self.filter_channels)
        x1 = rational_quadratic_spline_inverse(
            x1,
            h[..., :k] / scale,
            h[..., k : 2 * k] / scale,
            h[..., 2 * k :],
            tail_bound=self.config.dp_tail_bound,
            min_bin_width=self.config.dp_min_bin_width,
            min_bin_height=self.config.dp_min_bin_height,
            min_derivative=self.config.dp_min_derivative,
        )
        return torch.cat([x0, x1], 1) * x_mask


class StochasticDurationPredictor(nn.Module):
    """Flow-based duration model; at inference noise is pushed through the flows in reverse, conditioned
    on the (detached) text encoding, and the first channel is the log duration of each phoneme."""

    def __init__(self, config: VitsConfig):
        super().__init__()
        c = config
        fc = c.dp_filter_channels
        self.pre = nn.Conv1d(c.hidden_channels, fc, 1)
        self.convs = DDSConv(fc, c.dp_kernel_size, c.dp_n_layers)
        self.proj = nn.Conv1d(fc, fc, 1)
        # Two channels: the log duration and a dequantization/augmentation channel (discarded).
        self.flows = nn.ModuleList([ElementwiseAffine(2)])
        for i in range(c.dp_n_flows):
            flow = ConvFlow(2, fc, c.dp_kernel_size, c.dp_n_layers, c) if i > 0 else UnusedFlow()
            self.flows.extend([flow, Flip()])

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        # x: [B, hidden, T]; noise: [B, 2, T] already scaled by noise_w -> logw [B, 1, T]
        x = self.pre(x)
        x = self.convs(x, x_mask)
        x = self.proj(x) * x_mask
        # Reversed order, skipping the training-only spline flow next to ElementwiseAffine.
        flows = [f for f in reversed(self.flows) if not isinstance(f, UnusedFlow)]
        z = noise
        for flow in flows:
            z = flow.reverse(z, x_mask, g=x)  # type: ignore[operator]  # ModuleList items are untyped
        return z[:, :1]


def generate_path(duration: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hard monotonic alignment from integer durations.

    duration: [B, T] (ceiled, masked); mask: [B, F, T] -> path [B, F, T], path[b, f, t] = 1 iff frame f
    belongs to phoneme t (frames cum[t-1] <= f < cum[t]).
    """
    b, n_frames, t = mask.shape
    cum = torch.cumsum(duration, -1)  # [B, T]
    path = sequence_mask(cum.reshape(b * t), n_frames).to(mask.dtype).view(b, t, n_frames)
    path = path - F.pad(path, (0, 0, 1, 0))[:, :-1]  # keep frames of t not already covered by t-1
    return path.transpose(1, 2) * mask


# ---------------------------------------------------------------------------------------------------
# Flow


class WN(nn.Module):
    """WaveNet-style stack: dilated conv -> gated tanh*sigmoid -> 1x1 to residual + skip."""

    def __init__(self, hidden_channels: int, kernel_size: int, dilation_rate: int, n_layers: int):
        super().__init__()
        self.hidden_channels = hidden_channels
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        for i in range(n_layers):
            dilation = dilation_rate**i
            self.in_layers.append(
                nn.Conv1d(
                    hidden_channels,
                    2 * hidden_channels,
                    kernel_size,
                    dilation=dilation,
                    padding=get_padding(kernel_size, dilation),
                )
            )
            # The last layer only feeds the skip sum, so it has no residual half.
            res_skip_channels = 2 * hidden_channels if i < n_layers - 1 else hidden_channels
            self.res_skip_layers.append(nn.Conv1d(hidden_channels, res_skip_channels, 1))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        # x: [B, H, F] -> [B, H, F]
        h = self.hidden_channels
        output = torch.zeros_like(x)
        n = len(self.in_layers)
        for i, (in_layer, res_skip_layer) in enumerate(
            zip(self.in_layers, self.res_skip_layers, strict=False)
        ):
            x_in = in_layer(x)  # [B, 2H, F]
            acts = torch.tanh(x_in[:, :h]) * torch.sigmoid(x_in[:, h:])
            res_skip = res_skip_layer(acts)
            if i < n - 1:
                x = (x + res_skip[:, :h]) * x_mask
                output = output + res_skip[:, h:]
            else:
                output = output + res_skip
        return output * x_mask


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: x1 += WN(x0) (forward); reverse subtracts it. Volume preserving."""

    def __init__(self, config: VitsConfig):
        super().__init__()
        c = config
        self.half_channels = c.inter_channels // 2
        self.pre = nn.Conv1d(self.half_channels, c.flow_hidden_channels, 1)
        self.enc = WN(c.flow_hidden_channels, c.flow_kernel_size, c.flow_dilation_rate, c.flow_n_layers)
        self.post = nn.Conv1d(c.flow_hidden_channels, self.half_channels, 1)

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half_channels] * 2, 1)
        h = self.pre(x0) * x_mask
        h = self.enc(h, x_mask)
        m = self.post(h) * x_mask
        # mean_only: logs == 0, so the exp(-logs) factor of the general coupling is exactly 1.
        x1 = (x1 - m) * x_mask
        return torch.cat([x0, x1], 1)


class ResidualCouplingBlock(nn.Module):
    """Normalizing flow between the text prior and the posterior latent: coupling + Flip, repeated."""

    def __init__(self, config: VitsConfig):
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(config.flow_n_flows):
            self.flows.extend([ResidualCouplingLayer(config), Flip()])

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        # x: [B, inter, F]
        for flow in reversed(self.flows):
            x = flow.reverse(x, x_mask)  # type: ignore[operator]  # ModuleList items are untyped
        return x


# ---------------------------------------------------------------------------------------------------
# HiFi-GAN generator


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask


class ResBlock1(nn.Module):
    """HiFi-GAN V1 residual block: pairs of (dilated conv, plain conv)."""

    def __init__(self, channels: int, kernel_size: int, dilation: Sequence[int]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=get_padding(kernel_size, d))
            for d in dilation
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=get_padding(kernel_size)) for _ in dilation
        )

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor | None = None) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2, strict=False):
            xt = c1(_masked(F.leaky_relu(x, LRELU_SLOPE), x_mask))
            xt = c2(_masked(F.leaky_relu(xt, LRELU_SLOPE), x_mask))
            x = xt + x
        return _masked(x, x_mask)


class ResBlock2(nn.Module):
    """HiFi-GAN V3 residual block: dilated convs only (Piper's medium/low voices)."""

    def __init__(self, channels: int, kernel_size: int, dilation: Sequence[int]):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=get_padding(kernel_size, d))
            for d in dilation
        )

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor | None = None) -> torch.Tensor:
        for conv in self.convs:
            x = conv(_masked(F.leaky_relu(x, LRELU_SLOPE), x_mask)) + x
        return _masked(x, x_mask)


class Generator(nn.Module):
    """Latent frames -> waveform: transposed-conv upsampling, each stage followed by the mean of
    multi-receptive-field residual blocks."""

    # HiFi-GAN's fixed pre/post convolution kernel.
    PRE_POST_KERNEL = GENERATOR_PRE_POST_KERNEL

    def __init__(self, config: VitsConfig):
        super().__init__()
        c = config
        self.upsample_rates = list(c.upsample_rates)
        self.num_kernels = len(c.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(
            c.inter_channels,
            c.upsample_initial_channel,
            self.PRE_POST_KERNEL,
            padding=get_padding(self.PRE_POST_KERNEL),
        )
        resblock = {"1": ResBlock1, "2": ResBlock2}[c.resblock]
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = c.upsample_initial_channel
        for u, k in zip(c.upsample_rates, c.upsample_kernel_sizes, strict=False):
            # padding (k-u)/2 makes the output exactly u times longer than the input.
            self.ups.append(nn.ConvTranspose1d(ch, ch // 2, k, u, padding=(k - u) // 2))
            ch //= 2
            for rk, rd in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes, strict=False):
                self.resblocks.append(resblock(ch, rk, rd))
        self.conv_post = nn.Conv1d(
            ch, 1, self.PRE_POST_KERNEL, padding=get_padding(self.PRE_POST_KERNEL), bias=False
        )

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, inter, F], x_mask: [B, 1, F] or None (no padding) -> [B, 1, F*hop]
        # With a mask, every conv input past an item's end is zeroed, which is exactly the zero padding
        # that item sees when run alone: a padded batch then reproduces each item bit for bit (up to
        # float reassociation) instead of leaking the neighbours' tails into the last samples.
        x = _masked(self.conv_pre(x), x_mask)
        for i, (up, u) in enumerate(zip(self.ups, self.upsample_rates, strict=False)):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            if x_mask is not None:
                x_mask = x_mask.repeat_interleave(u, dim=-1)
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            xs = blocks[0](x, x_mask)
            for block in blocks[1:]:
                xs = xs + block(x, x_mask)
            x = xs / self.num_kernels
        x = self.conv_post(F.leaky_relu(x, FINAL_LRELU_SLOPE))
        return torch.tanh(x)


# ---------------------------------------------------------------------------------------------------
# The whole synthesizer


class VitsOutput(NamedTuple):
    audio: torch.Tensor  # [B, S] float32, zero past each item's length
    audio_lengths: torch.Tensor  # [B] long, samples per item
    durations: torch.Tensor  # [B, T] float32, ceiled frames per phoneme (0 on padding)


# A torch generator, or a numpy one (engine/noise.py: the stream the onnx engine's graph reads too).
NoiseGenerator = torch.Generator | np.random.Generator
GeneratorArg = NoiseGenerator | Sequence[NoiseGenerator] | None


class Vits(nn.Module):
    """Piper's VITS synthesizer (enc_p, dp, flow, dec as in the checkpoint), inference only.

    decoder_dtype: the dtype the HiFi-GAN generator holds its weights and runs in (None = fp32).
    Everything before it (text encoder, duration predictor, flow) stays fp32 regardless.
    """

    def __init__(self, config: VitsConfig, decoder_dtype: torch.dtype | None = None):
        super().__init__()
        if config.n_speakers > 1 or config.gin_channels > 0:
            raise NotImplementedError("multi-speaker VITS (speaker embedding conditioning) is not supported")
        self.config = config
        self.enc_p = TextEncoder(config)
        self.dp = StochasticDurationPredictor(config)
        self.flow = ResidualCouplingBlock(config)
        self.dec = Generator(config)
        self.set_decoder_dtype(decoder_dtype)

    def set_decoder_dtype(self, dtype: torch.dtype | None) -> Vits:
        self.dec.to(dtype or torch.float32)
        return self

    @property
    def decoder_dtype(self) -> torch.dtype:
        return self.dec.conv_pre.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.enc_p.emb.weight.device

    # -- noise ------------------------------------------------------------------------------------

    @staticmethod
    def _generators(generator: GeneratorArg, batch: int) -> list[NoiseGenerator | None]:
        if generator is None or isinstance(generator, torch.Generator | np.random.Generator):
            return [generator] * batch
        generators: list[NoiseGenerator | None] = list(generator)
        if len(generators) != batch:
            raise ValueError(f"{len(generators)} generators for a batch of {batch}")
        return generators

    def _draw(
        self, generators: list[NoiseGenerator | None], channels: int, lengths: list[int], width: int
    ) -> torch.Tensor:
        """Standard normal noise [B, channels, width], drawn per item at its own length (zeros after),
        so an item's noise depends only on its generator, never on what it is batched with. A numpy
        generator's values are laid out row-major, as the onnx graph reshapes its noise feed."""
        items = []
        for gen, length in zip(generators, lengths, strict=False):
            if isinstance(gen, np.random.Generator):
                flat = gen.standard_normal(channels * length, dtype=np.float32)
                eps = torch.from_numpy(flat).reshape(channels, length)
            else:
                device = gen.device if gen is not None else self.device
                eps = torch.randn((channels, length), generator=gen, device=device, dtype=torch.float32)
            items.append(F.pad(eps.to(self.device), (0, width - length)))
        return torch.stack(items)

    @staticmethod
    def _check_noise(noise: torch.Tensor, shape: tuple[int, ...], key: str) -> torch.Tensor:
        if tuple(noise.shape) != shape:
            raise ValueError(f"noise[{key!r}] has shape {tuple(noise.shape)}, expected {shape}")
        return noise

    # -- inference --------------------------------------------------------------------------------

    def _encode_and_durations(
        self,
        phoneme_ids: torch.Tensor,
        lengths: torch.Tensor,
        length_scale: float,
        noise_w: float,
        generators: list[NoiseGenerator | None],
        noise: dict | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t = phoneme_ids.shape
        x, m_p, logs_p, x_mask = self.enc_p(phoneme_ids, lengths)
        if noise is not None and "dp" in noise:
            eps = self._check_noise(noise["dp"], (b, 2, t), "dp")
        else:
            eps = self._draw(generators, 2, lengths.tolist(), t)
        eps = eps.to(device=x.device, dtype=x.dtype)
        logw = self.dp.reverse(x, x_mask, eps * noise_w)  # [B, 1, T]
        w = torch.exp(logw) * x_mask * length_scale
        w_ceil = torch.ceil(w)  # [B, 1, T]
        return m_p, logs_p, x_mask, w_ceil

    @torch.no_grad()
    def durations(
        self,
        phoneme_ids: torch.Tensor,
        lengths: torch.Tensor,
        length_scale: float,
        noise_w: float,
        generator: GeneratorArg = None,
        noise: dict | None = None,
    ) -> torch.Tensor:
        """Ceiled frames per phoneme [B, T] (0 on padding) without running flow and generator."""
        generators = self._generators(generator, phoneme_ids.size(0))
        return self._encode_and_durations(phoneme_ids, lengths, length_scale, noise_w, generators, noise)[3][
            :, 0
        ]

    @torch.no_grad()
    def latent(
        self,
        phoneme_ids: torch.Tensor,
        lengths: torch.Tensor,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
        generator: GeneratorArg = None,
        noise: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Text encoder, durations and flow: the decoder's input without running the decoder.

        Returns z [B, inter, F] fp32 (zero past each item's frames), y_lengths [B] long and the ceiled
        durations [B, T]. Arguments as for infer(). The decoder (`decode`) can then run over the whole
        of z or over frame windows of it (engine/windows.py): it is convolutional, so a window with
        enough context on each side gives the same samples as the whole.
        """
        b, _t = phoneme_ids.shape
        lengths = lengths.to(phoneme_ids.device)
        generators = self._generators(generator, b)
        m_p, logs_p, x_mask, w_ceil = self._encode_and_durations(
            phoneme_ids, lengths, length_scale, noise_w, generators, noise
        )

        # Frames per item; VITS never lets an item be empty.
        y_lengths = torch.clamp_min(torch.sum(w_ceil, [1, 2]), 1).long()  # [B]
        n_frames = int(y_lengths.max())
        y_mask = sequence_mask(y_lengths, n_frames).unsqueeze(1).to(x_mask.dtype)  # [B, 1, F]
        attn_mask = x_mask.unsqueeze(2) * y_mask.unsqueeze(-1)  # [B, 1, F, T]
        attn = generate_path(w_ceil[:, 0], attn_mask[:, 0])  # [B, F, T]
        # Expand the per-phoneme prior to frames (each row of attn has one 1).
        m_p = torch.matmul(attn, m_p.transpose(1, 2)).transpose(1, 2)  # [B, inter, F]
        logs_p = torch.matmul(attn, logs_p.transpose(1, 2)).transpose(1, 2)

        shape = (b, self.config.inter_channels, n_frames)
        if noise is not None and "prior" in noise:
            eps = self._check_noise(noise["prior"], shape, "prior")
        else:
            eps = self._draw(generators, self.config.inter_channels, y_lengths.tolist(), n_frames)
        eps = eps.to(device=m_p.device, dtype=m_p.dtype)
        z_p = m_p + eps * torch.exp(logs_p) * noise_scale  # [B, inter, F]

        z = self.flow.reverse(z_p, y_mask)  # [B, inter, F]
        return z * y_mask, y_lengths, w_ceil[:, 0]

    @torch.no_grad()
    def decode(self, z: torch.Tensor, y_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The HiFi-GAN generator over latent frames z [B, inter, F] -> audio [B, F * hop] fp32.

        y_lengths: frames per item when the batch is padded (None: every item fills F); samples past
        an item's end are zero. Runs in decoder_dtype.
        """
        dtype = self.decoder_dtype
        n_frames = z.size(-1)
        padded = y_lengths is not None and bool((y_lengths < n_frames).any())
        y_mask = None
        if padded:
            assert y_lengths is not None
            y_mask = sequence_mask(y_lengths, n_frames).unsqueeze(1).to(dtype)
        audio = self.dec(z.to(dtype), y_mask)[:, 0].float()  # [B, S]
        if padded:
            assert y_lengths is not None
            audio_lengths = y_lengths * self.config.hop_length
            audio = audio * sequence_mask(audio_lengths, audio.size(1)).to(audio.dtype)
        return audio

    @torch.no_grad()
    def infer(
        self,
        phoneme_ids: torch.Tensor,
        lengths: torch.Tensor,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
        generator: GeneratorArg = None,
        noise: dict | None = None,
    ) -> VitsOutput:
        """Synthesize a padded batch.

        phoneme_ids: [B, T] long; lengths: [B] long. generator: one torch.Generator (items draw from
        it in turn), one per item (an item's audio then depends only on its own seed, batched or not),
        or None (torch's global RNG). noise: optional standard-normal tensors to use instead of drawing,
        {"dp": [B, 2, T], "prior": [B, inter_channels, F]} where F = max frames (see durations()).
        """
        z, y_lengths, durations = self.latent(
            phoneme_ids, lengths, noise_scale, length_scale, noise_w, generator, noise
        )
        audio = self.decode(z, y_lengths)
        return VitsOutput(audio, y_lengths * self.config.hop_length, durations)
