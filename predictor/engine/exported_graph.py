"""Rewrites of Piper's exported ONNX graph that the onnx engine runs, with onnx alone (no torch, so the
CPU image can apply them to an artifact published before they existed):

  * ``split_onnx``: cut at the generator's input into an encoder (phoneme ids -> latent frames)
    and decoder.onnx (latent -> audio), so a stream can decode the latent in windows;
  * ``split_flow``: cut the encoder again at the flow's input into prior.onnx (phoneme ids -> the
    prior's sample z_p, the frame mask and the durations) and flow.onnx (z_p -> latent), so a stream
    can run the flow in pieces too (engine/windows.py);
  * ``feed_noise``: the encoder's RandomNormalLike nodes read from an input (engine/noise.py), so a
    seed means the same audio on either engine;
  * ``expose_durations``: the encoder gives out each phoneme id's frames (word timestamps).

Publish applies all of them (engine/convert.write_onnx_split); engine/exported.py applies what an
older artifact lacks, in memory, at load.
"""

from __future__ import annotations

from typing import Any

from predictor.engine.voice_files import DURATIONS_NAME, LATENT_NAME, MASK_NAME, NOISE_NAME, PRIOR_NAME

_DECODER_FIRST_NODE = "/dec/conv_pre/Conv"
_FLOW_SCOPE = "/flow/"  # the export names the ResidualCouplingBlock's nodes after its module path
_DURATIONS_NODE = "/Ceil"  # w_ceil = ceil(exp(logw) * x_mask * length_scale): frames per phoneme id


class ConversionError(RuntimeError):
    """The ONNX graph does not map onto the VITS module exactly."""


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def split_onnx(onnx_model: Any) -> tuple[Any, Any]:
    """Piper's graph (a path or ModelProto) -> (encoder, decoder) ModelProtos, cut at the generator.

    The encoder keeps the graph's inputs (input, input_lengths, scales) and outputs `latent`
    [1, inter, F] (z times the frame mask, what the generator reads); the decoder takes `latent`
    and outputs `output` as the whole graph does. Both parts together run every node once, so a
    non-streamed request costs what the whole graph costs.
    """
    import onnx
    import onnx.utils

    model = onnx_model if isinstance(onnx_model, onnx.ModelProto) else onnx.load(str(onnx_model))
    first = next((n for n in model.graph.node if n.name == _DECODER_FIRST_NODE), None)
    if first is None:
        raise ConversionError(f"no {_DECODER_FIRST_NODE} node: not a Piper VITS graph")
    cut = first.input[0]
    extractor = onnx.utils.Extractor(model)
    inputs = [i.name for i in model.graph.input]
    encoder = extractor.extract_model(inputs, [cut])
    decoder = extractor.extract_model([cut], [o.name for o in model.graph.output])
    for part in (encoder, decoder):
        for node in part.graph.node:
            node.input[:] = [LATENT_NAME if i == cut else i for i in node.input]
            node.output[:] = [LATENT_NAME if o == cut else o for o in node.output]
    encoder.graph.output[0].name = LATENT_NAME
    decoder.graph.input[0].name = LATENT_NAME
    return prepare_encoder(encoder), decoder


def split_flow(encoder: Any) -> tuple[Any, Any]:
    """The encoder (split_onnx's first part) -> (prior, flow) ModelProtos, cut at the flow's input.

    The prior keeps the encoder's inputs and gives out ``prior`` (z_p = m_p + noise * exp(logs_p) *
    noise_scale, [1, inter, F]), ``frame_mask`` [1, 1, F] and ``durations``; the flow takes ``prior``
    and ``frame_mask`` and gives out ``latent`` as the encoder did. Found by structure, not by the
    export's tensor names: z_p is what the first flow node reads, and the flow's nodes are those on a
    path from z_p to the latent (some of them unnamed); the one tensor they read from outside that is
    not a constant must be the mask. Both parts together run every node of the encoder once.
    """
    import onnx.utils

    graph = encoder.graph
    first = next((n for n in graph.node if n.name.startswith(_FLOW_SCOPE)), None)
    if first is None or not any(o.name == LATENT_NAME for o in graph.output):
        raise ConversionError(f"no {_FLOW_SCOPE} nodes or no {LATENT_NAME} output: not a Piper VITS encoder")
    prior = first.input[0]
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    after: set[str] = set()  # nodes fed, at any distance, by z_p
    pending = [prior]
    while pending:
        for node in consumers.get(pending.pop(), []):
            if node.name not in after:
                after.add(node.name)
                pending.extend(node.output)
    before: set[str] = set()  # nodes the latent depends on
    pending = [LATENT_NAME]
    while pending:
        node = producers.get(pending.pop())
        if node is not None and node.name not in before:
            before.add(node.name)
            pending.extend(node.input)
    flow = [n for n in graph.node if n.name in after and n.name in before]
    made = {o for n in flow for o in n.output}
    constants = {i.name for i in graph.initializer}
    outside = {
        name
        for node in flow
        for name in node.input
        if name
        and name != prior
        and name not in made
        and name not in constants
        and (name not in producers or producers[name].op_type != "Constant")
    }
    if len(outside) != 1:
        raise ConversionError(f"the flow reads {sorted(outside)} besides z_p, not just the frame mask")
    (mask,) = outside
    extractor = onnx.utils.Extractor(encoder)
    inputs = [i.name for i in graph.input]
    first_part = extractor.extract_model(inputs, [prior, mask, DURATIONS_NAME])
    second_part = extractor.extract_model([prior, mask], [LATENT_NAME])
    renames = {prior: PRIOR_NAME, mask: MASK_NAME}
    for part in (first_part, second_part):
        for node in part.graph.node:
            node.input[:] = [renames.get(i, i) for i in node.input]
            node.output[:] = [renames.get(o, o) for o in node.output]
        for value in [*part.graph.input, *part.graph.output]:
            value.name = renames.get(value.name, value.name)
    return first_part, second_part


def prepare_encoder(encoder: Any) -> Any:
    """The encoder as the onnx engine runs it: noise fed from an input (feed_noise) and the frames of
    each phoneme id given out (expose_durations). Idempotent, so an encoder split before either
    existed is brought up to date at load."""
    return expose_durations(feed_noise(encoder))


def expose_durations(encoder: Any) -> Any:
    """The encoder with a second output ``durations`` [1, 1, T]: the ceiled frames of each phoneme id,
    which the graph computes anyway (word timestamps read them). Returned as it is if it has it."""
    from onnx import TensorProto, helper

    graph = encoder.graph
    if any(o.name == DURATIONS_NAME for o in graph.output):
        return encoder
    ceil = next((n for n in graph.node if n.name == _DURATIONS_NODE), None)
    if ceil is None:
        raise ConversionError(f"no {_DURATIONS_NODE} node: not a Piper VITS encoder")
    graph.node.append(
        helper.make_node("Identity", [ceil.output[0]], [DURATIONS_NAME], name="durations/Identity")
    )
    graph.output.append(helper.make_tensor_value_info(DURATIONS_NAME, TensorProto.FLOAT, [1, 1, "phonemes"]))
    return encoder


def feed_noise(encoder: Any) -> Any:
    """The encoder with its noise read from an input instead of drawn inside (engine/noise.py).

    Piper's graph draws its noise with RandomNormalLike, which onnxruntime seeds once per session, not
    per run. Each such node, in graph order (the duration predictor's, then the prior's), becomes the
    next slice of the 1-D float32 input ``noise``, reshaped to the node's shape: node k reads the
    values after those of nodes 0..k-1. A feed longer than the graph needs is fine (the rest is
    unread); a shorter one fails the Reshape named ``noise/k/Reshape``. An encoder that has the input
    already is returned as it is.
    """
    from onnx import TensorProto, helper

    graph = encoder.graph
    if any(i.name == NOISE_NAME for i in graph.input):
        return encoder
    draws = [n for n in graph.node if n.op_type == "RandomNormalLike"]
    if not draws:
        raise ConversionError("no RandomNormalLike node: not a Piper VITS encoder")
    nodes: list[Any] = []
    offset = f"{NOISE_NAME}/start"
    nodes.append(
        helper.make_node(
            "Constant", [], [offset], value=helper.make_tensor(offset, TensorProto.INT64, [1], [0])
        )
    )
    replaced: dict[str, list[Any]] = {}
    for k, draw in enumerate(draws):
        attrs = _attrs(draw)
        if attrs.get("dtype", TensorProto.FLOAT) != TensorProto.FLOAT:
            raise ConversionError(f"{draw.name} draws dtype {attrs['dtype']}, not float32")
        p = f"{NOISE_NAME}/{k}"
        end = f"{p}/end"
        out = draw.output[0]
        standard = f"{p}/standard" if (attrs.get("mean", 0.0), attrs.get("scale", 1.0)) != (0.0, 1.0) else out
        steps = [
            helper.make_node("Shape", [draw.input[0]], [f"{p}/shape"], name=f"{p}/Shape"),
            helper.make_node(
                "ReduceProd", [f"{p}/shape"], [f"{p}/count"], name=f"{p}/ReduceProd", keepdims=1
            ),
            helper.make_node("Add", [offset, f"{p}/count"], [end], name=f"{p}/Add"),
            helper.make_node("Slice", [NOISE_NAME, offset, end], [f"{p}/flat"], name=f"{p}/Slice"),
            helper.make_node("Reshape", [f"{p}/flat", f"{p}/shape"], [standard], name=f"{p}/Reshape"),
        ]
        if standard != out:
            scale, mean = f"{p}/scale", f"{p}/mean"
            steps += [
                helper.make_node(
                    "Constant",
                    [],
                    [scale],
                    value=helper.make_tensor(scale, TensorProto.FLOAT, [], [attrs["scale"]]),
                ),
                helper.make_node(
                    "Constant",
                    [],
                    [mean],
                    value=helper.make_tensor(mean, TensorProto.FLOAT, [], [attrs["mean"]]),
                ),
                helper.make_node("Mul", [standard, scale], [f"{p}/scaled"], name=f"{p}/Mul"),
                helper.make_node("Add", [f"{p}/scaled", mean], [out], name=f"{p}/AddMean"),
            ]
        replaced[draw.name] = steps
        offset = end
    for node in graph.node:
        nodes.extend(replaced.get(node.name, [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.input.append(helper.make_tensor_value_info(NOISE_NAME, TensorProto.FLOAT, ["noise_values"]))
    return encoder
