"""Voice artifacts as earlier publishes wrote them, for the load-time rewrites (engine/exported_graph.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def as_published_before_noise_and_durations(voice_dir: Path, out_dir: Path) -> Path:
    """A copy of ``voice_dir`` as publish wrote it before the flow was cut off and before the noise
    input and durations output: encoder.onnx (prior and flow in one part) drawing its noise inside
    (RandomNormalLike, no ``noise`` input) and giving out no ``durations``, beside decoder.onnx; no
    prior.onnx or flow.onnx. Made by undoing the rewrites on the encoder split_onnx cuts, so the test
    does not lean on the rewrites it tests. Its decoder.onnx is as it was then too: the transposed
    convolutions untouched (``untouched_decoder``)."""
    import onnx
    from onnx import helper

    from predictor.engine.exported_graph import split_onnx
    from predictor.engine.voice_files import (
        DECODER_ONNX,
        DURATIONS_NAME,
        ENCODER_ONNX,
        FLOW_ONNX,
        NOISE_NAME,
        PRIOR_ONNX,
    )

    shutil.copytree(voice_dir, out_dir)
    for part in (PRIOR_ONNX, FLOW_ONNX):
        (out_dir / part).unlink()
    onnx.save(untouched_decoder(out_dir / "model.onnx"), str(out_dir / DECODER_ONNX))
    encoder, _ = split_onnx(out_dir / "model.onnx")
    graph = encoder.graph
    producers = {o: n for n in graph.node for o in n.output}
    kept, k = [], 0
    for node in graph.node:
        ours = node.name.startswith(f"{NOISE_NAME}/") or node.output[0].startswith(f"{NOISE_NAME}/")
        if node.name == "durations/Identity":
            continue
        if ours:
            if node.op_type == "Reshape":
                # The rewrite's Reshape takes its shape from Shape(x): RandomNormalLike(x) again.
                shape_of = producers[node.input[1]].input[0]
                kept.append(
                    helper.make_node(
                        "RandomNormalLike", [shape_of], [node.output[0]], name=f"/rnl{k}", dtype=1
                    )
                )
                k += 1
            continue
        kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    inputs = [i for i in graph.input if i.name != NOISE_NAME]
    del graph.input[:]
    graph.input.extend(inputs)
    outputs = [o for o in graph.output if o.name != DURATIONS_NAME]
    del graph.output[:]
    graph.output.extend(outputs)
    onnx.save(encoder, str(out_dir / ENCODER_ONNX))
    return out_dir


def untouched_decoder(model_onnx: Path) -> Any:
    """Piper's graph cut at the generator's input (``latent``) with nothing rewritten: the decoder.onnx
    publish wrote before polyphase_upsampling."""
    import onnx
    import onnx.utils

    from predictor.engine.voice_files import LATENT_NAME

    piper = onnx.load(str(model_onnx))
    cut = next(n for n in piper.graph.node if n.name == "/dec/conv_pre/Conv").input[0]
    decoder = onnx.utils.Extractor(piper).extract_model([cut], [o.name for o in piper.graph.output])
    for node in decoder.graph.node:
        node.input[:] = [LATENT_NAME if i == cut else i for i in node.input]
    decoder.graph.input[0].name = LATENT_NAME
    return decoder
