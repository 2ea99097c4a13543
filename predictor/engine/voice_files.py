"""A published voice's files as the engines read them at load: their names and the runtime loaders.

Publish (artifact/publish.py with engine/convert.py) writes these files; a serving process only
reads them, so nothing here converts or splits a graph.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from predictor.engine.vits_config import VitsConfig

if TYPE_CHECKING:  # the onnxruntime engine reads the names and the config here without torch
    import torch

    from predictor.engine.vits import Vits

CONFIG_FILE = "vits.json"
WEIGHTS_FILE = "model.safetensors"
# Piper's graph cut so a stream can run the flow and the decoder in pieces: text -> the prior's
# sample (text encoder, durations, prior), that sample -> latent (the flow, one file per coupling
# layer: flow_stage_files), latent -> the first upsampling stage's output (the HiFi-GAN generator's
# head), that -> audio (its tail, which the CPU runs in chunks of frames: engine/exported.py).
PRIOR_ONNX = "prior.onnx"
DECODER_HEAD_ONNX = "decoder_head.onnx"
DECODER_TAIL_ONNX = "decoder_tail.onnx"
# What publish wrote before the generator was cut: the whole generator in one part (run whole).
DECODER_ONNX = "decoder.onnx"
# What publish wrote before the flow was cut into its coupling layers: the whole flow (run whole).
FLOW_ONNX = "flow.onnx"
# What publish wrote before the flow was cut off: prior and flow in one part (split at load).
ENCODER_ONNX = "encoder.onnx"
PRIOR_NAME = "prior"  # z_p [1, inter, F]: the prior's output, the flow's input
MASK_NAME = "frame_mask"  # [1, 1, F] float, ones for one sentence: the prior's output, the flow's input
LATENT_NAME = "latent"  # the flow's output, the decoder's input [1, inter, F]
UPSAMPLED_NAME = "upsampled"  # the decoder head's output, its tail's input [1, C, F * upsample_rates[0]]
DURATIONS_NAME = "durations"  # the prior's third output: ceiled frames per phoneme id [1, 1, T]
NOISE_NAME = "noise"  # the prior's noise input (engine/noise.py): [N] float32, read as a prefix


def flow_stage_files(couplings: int) -> list[str]:
    """The flow's files in the order they run, one per coupling layer (VitsConfig.flow_n_flows of
    them: flow_0.onnx, flow_1.onnx, ...), each reading PRIOR_NAME and MASK_NAME and giving out
    LATENT_NAME."""
    return [f"flow_{k}.onnx" for k in range(couplings)]


def read_config(model_dir: str | Path) -> VitsConfig:
    """The voice's VitsConfig from vits.json."""
    return VitsConfig.from_dict(json.loads((Path(model_dir) / CONFIG_FILE).read_text(encoding="utf-8")))


def load_vits(
    model_dir: str | Path, device: str | torch.device = "cpu", decoder_dtype: torch.dtype | None = None
) -> Vits:
    """Build Vits from vits.json + model.safetensors (mmapped on CPU), strict load, eval mode.

    (Building on the meta device and assigning the loaded tensors would skip the ~0.15 s random
    init, but torch's first meta-device construction costs ~2 s, so this copies.)
    """
    from safetensors.torch import load_file

    from predictor.engine.vits import Vits

    model_dir = Path(model_dir)
    config = read_config(model_dir)
    state = load_file(str(model_dir / WEIGHTS_FILE), device=str(device))
    vits = Vits(config, decoder_dtype=decoder_dtype).to(device)
    vits.load_state_dict(state, strict=True)
    return vits.eval()
