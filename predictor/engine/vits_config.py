"""The VITS inference graph's hyperparameters (VitsConfig), apart from the graph itself (vits.py), so
that what reads a voice's vits.json without running our PyTorch graph (the onnxruntime engine, the
decoder windows) does not import torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

# The HiFi-GAN generator's first and last convolutions (conv_pre, conv_post): their kernel sets how
# many latent frames of context a decoder window needs (windows.py).
GENERATOR_PRE_POST_KERNEL = 7


@dataclass
class VitsConfig:
    """Every hyperparameter of the inference graph; the converter reads them off the artifact."""

    # TextEncoder: phoneme embedding + relative-position transformer encoder.
    n_vocab: int  # number of phoneme ids
    hidden_channels: int  # encoder width
    filter_channels: int  # FFN inner width
    n_heads: int
    n_layers: int  # transformer layers
    kernel_size: int  # FFN conv kernel
    window_size: int  # relative attention sees [-window_size, window_size]
    heads_share: bool  # one relative embedding table for all heads
    inter_channels: int  # latent (prior / flow / decoder input) channels
    # StochasticDurationPredictor.
    dp_filter_channels: int
    dp_kernel_size: int
    dp_n_layers: int  # DDSConv layers (dilation kernel_size**i)
    dp_n_flows: int  # ConvFlow+Flip pairs (training had one more spline flow in front, unused in reverse)
    dp_num_bins: int  # rational-quadratic spline bins
    dp_tail_bound: float  # spline acts on [-tail_bound, tail_bound], identity outside
    # ResidualCouplingBlock.
    flow_n_flows: int  # coupling layer + Flip pairs
    flow_hidden_channels: int
    flow_kernel_size: int
    flow_dilation_rate: int  # WN layer i uses dilation flow_dilation_rate**i
    flow_n_layers: int  # WN layers per coupling layer
    # HiFi-GAN Generator.
    resblock: str  # "1" (three dilated conv pairs) or "2" (dilated convs only)
    resblock_kernel_sizes: list[int]
    resblock_dilation_sizes: list[list[int]]
    upsample_rates: list[int]
    upsample_initial_channel: int
    upsample_kernel_sizes: list[int]
    # Speakers: only single-speaker voices are supported (no speaker conditioning layers).
    n_speakers: int = 1
    gin_channels: int = 0
    # Spline limits from VITS' transforms.py (keep bins and slopes away from zero).
    dp_min_bin_width: float = 1e-3
    dp_min_bin_height: float = 1e-3
    dp_min_derivative: float = 1e-3

    @property
    def hop_length(self) -> int:
        """Audio samples per latent frame: the generator's total upsampling."""
        return math.prod(self.upsample_rates)

    def to_dict(self) -> dict:
        """JSON-able; hop_length is included for readers and checked again by from_dict."""
        return {**asdict(self), "hop_length": self.hop_length}

    @classmethod
    def from_dict(cls, raw: dict) -> VitsConfig:
        raw = dict(raw)
        hop_length = raw.pop("hop_length", None)
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown VitsConfig keys: {sorted(unknown)}")
        config = cls(**raw)
        config.resblock_kernel_sizes = [int(k) for k in config.resblock_kernel_sizes]
        config.resblock_dilation_sizes = [[int(d) for d in ds] for ds in config.resblock_dilation_sizes]
        config.upsample_rates = [int(u) for u in config.upsample_rates]
        config.upsample_kernel_sizes = [int(k) for k in config.upsample_kernel_sizes]
        if hop_length is not None and hop_length != config.hop_length:
            raise ValueError(f"hop_length {hop_length} != product of upsample_rates {config.hop_length}")
        return config
