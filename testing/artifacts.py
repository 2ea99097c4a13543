"""Voice artifacts as earlier publishes wrote them, for the load-time rewrites (engine/exported_graph.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def as_published_before_noise_and_durations(voice_dir: Path, out_dir: Path) -> Path:
    """A copy of ``voice_dir`` as publish wrote it before the flow was cut off and before any rewrite:
    encoder.onnx (prior and flow in one part) drawing its noise inside (RandomNormalLike, no ``noise``
    input) and giving out no ``durations``, beside a decoder.onnx with its transposed convolutions; no
    prior.onnx, flow files or decoder head and tail. Piper's graph cut at the generator and nothing else
    (``cut_at_generator``), so the test does not lean on the rewrites it tests."""
    import onnx

    from predictor.engine.exported_graph import cut_at_generator
    from predictor.engine.voice_files import (
        DECODER_HEAD_ONNX,
        DECODER_ONNX,
        DECODER_TAIL_ONNX,
        ENCODER_ONNX,
        PRIOR_ONNX,
        flow_stage_files,
        read_config,
    )

    shutil.copytree(voice_dir, out_dir)
    flow = flow_stage_files(read_config(out_dir).flow_n_flows)
    for part in (PRIOR_ONNX, *flow, DECODER_HEAD_ONNX, DECODER_TAIL_ONNX):
        (out_dir / part).unlink()
    encoder, decoder = cut_at_generator(out_dir / "model.onnx")
    onnx.save(encoder, str(out_dir / ENCODER_ONNX))
    onnx.save(decoder, str(out_dir / DECODER_ONNX))
    return out_dir


def untouched_decoder(model_onnx: Path) -> Any:
    """The decoder.onnx publish wrote before polyphase_upsampling and cut_decoder: Piper's graph cut at
    the generator's input (``latent``), nothing rewritten."""
    from predictor.engine.exported_graph import cut_at_generator

    return cut_at_generator(model_onnx)[1]


def prior_before_banded_attention(model_onnx: Path) -> Any:
    """The prior.onnx publish wrote before banded_attention: Piper's encoder with its noise fed
    (feed_noise) and durations given out (expose_durations), cut at the flow, its attention as
    exported (relative terms over every pair of phonemes)."""
    from predictor.engine.exported_graph import cut_at_generator, expose_durations, feed_noise, split_flow

    return split_flow(expose_durations(feed_noise(cut_at_generator(model_onnx)[0])))[0]


def as_published_before_the_decoder_cut(voice_dir: Path, out_dir: Path) -> Path:
    """A copy of ``voice_dir`` as publish wrote it before cut_decoder: prior.onnx and the flow beside
    one decoder.onnx, the whole generator with its upsamplings as convolutions (polyphase_upsampling)."""
    import onnx

    from predictor.engine.exported_graph import polyphase_upsampling
    from predictor.engine.voice_files import DECODER_HEAD_ONNX, DECODER_ONNX, DECODER_TAIL_ONNX

    shutil.copytree(voice_dir, out_dir)
    for part in (DECODER_HEAD_ONNX, DECODER_TAIL_ONNX):
        (out_dir / part).unlink()
    onnx.save(polyphase_upsampling(untouched_decoder(out_dir / "model.onnx")), str(out_dir / DECODER_ONNX))
    return out_dir


def as_published_before_the_coupling_cut(voice_dir: Path, out_dir: Path) -> Path:
    """A copy of ``voice_dir`` as publish wrote it before split_couplings: the flow in one flow.onnx
    (split_flow's second part) instead of one file per coupling layer."""
    import onnx

    from predictor.engine.exported_graph import split_flow, split_onnx
    from predictor.engine.voice_files import FLOW_ONNX, flow_stage_files, read_config

    shutil.copytree(voice_dir, out_dir)
    for part in flow_stage_files(read_config(out_dir).flow_n_flows):
        (out_dir / part).unlink()
    onnx.save(split_flow(split_onnx(out_dir / "model.onnx")[0])[1], str(out_dir / FLOW_ONNX))
    return out_dir
