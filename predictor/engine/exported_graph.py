"""Rewrites of Piper's exported ONNX graph that the onnx engine runs, with onnx alone (no torch, so the
CPU image can apply them to an artifact published before they existed):

  * ``split_onnx``: cut at the generator's input (``cut_at_generator``) into an encoder (phoneme
    ids -> latent frames) and the generator (latent -> audio), so a stream can decode the latent in
    windows;
  * ``cut_decoder``: the generator cut after its first upsampling stage into decoder_head.onnx and
    decoder_tail.onnx, so the CPU can run the tail in cache-sized chunks (engine/exported.py);
  * ``split_flow``: cut the encoder again at the flow's input into prior.onnx (phoneme ids -> the
    prior's sample z_p, the frame mask and the durations) and the flow (z_p -> latent), so a stream
    can run the flow in pieces too (engine/windows.py);
  * ``split_couplings``: the flow cut at each coupling layer (flow_0.onnx, flow_1.onnx, ...), so a
    stream's pieces of it redo only each layer's own context (windows.flow_runs);
  * ``feed_noise``: the encoder's RandomNormalLike nodes read from an input (engine/noise.py), so a
    seed means the same audio on either engine;
  * ``expose_durations``: the encoder gives out each phoneme id's frames (word timestamps);
  * ``banded_attention``: the text encoder's relative-position terms computed over the window of
    offsets that has embeddings, not over every pair of phonemes (the same sums without the zeros);
  * ``polyphase_upsampling``: the decoder's transposed convolutions as ordinary ones, one output
    channel per phase, interleaved (the same sums in another order, in about half the time);
  * ``planar_convolutions``: the decoder's 1-D convolutions as 2-D ones over a height of one, which
    onnxruntime's layout optimization runs in its channel-blocked layout (engine/exported.py).

Publish applies all of them (engine/convert.write_onnx_split); engine/exported.py applies what an
older artifact lacks, in memory, at load, where it has to load onnx anyway: an artifact that already
holds prior.onnx and the flow (its coupling layers, or one flow.onnx) beside the decoder (as head and
tail, or one decoder.onnx) is loaded as it is (no onnx import at cold start), so a flow.onnx published
before split_couplings, or a decoder.onnx before polyphase_upsampling or cut_decoder, runs unchanged
(the same audio, slower) until the voice is published again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.engine.voice_files import (
    DURATIONS_NAME,
    LATENT_NAME,
    MASK_NAME,
    NOISE_NAME,
    PRIOR_NAME,
    UPSAMPLED_NAME,
)

_DECODER_FIRST_NODE = "/dec/conv_pre/Conv"
_FLOW_SCOPE = "/flow/"  # the export names the ResidualCouplingBlock's nodes after its module path
_DURATIONS_NODE = "/Ceil"  # w_ceil = ceil(exp(logw) * x_mask * length_scale): frames per phoneme id


class ConversionError(RuntimeError):
    """The ONNX graph does not map onto the VITS module exactly."""


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def split_onnx(onnx_model: Any) -> tuple[Any, Any, Any]:
    """Piper's graph (a path or ModelProto) -> (encoder, decoder head, decoder tail) as the onnx engine
    runs them: cut at the generator (cut_at_generator), the encoder prepared (prepare_encoder), the
    generator cut in two with its upsamplings as convolutions (prepare_decoder)."""
    encoder, decoder = cut_at_generator(onnx_model)
    return (prepare_encoder(encoder), *prepare_decoder(decoder))


def cut_at_generator(onnx_model: Any) -> tuple[Any, Any]:
    """Piper's graph (a path or ModelProto) -> (encoder, decoder) ModelProtos, cut at the generator,
    nothing rewritten (what publish wrote before any rewrite).

    The encoder keeps the graph's inputs (input, input_lengths, scales) and outputs `latent`
    [1, inter, F] (z times the frame mask, what the generator reads); the decoder takes `latent`
    and outputs `output` as the whole graph does. Both parts together run every node once, so a
    non-streamed request costs what the whole graph costs.
    """
    import onnx

    model = onnx_model if isinstance(onnx_model, onnx.ModelProto) else onnx.load(str(onnx_model))
    first = next((n for n in model.graph.node if n.name == _DECODER_FIRST_NODE), None)
    if first is None:
        raise ConversionError(f"no {_DECODER_FIRST_NODE} node: not a Piper VITS graph")
    return _cut(model, first.input[0], LATENT_NAME)


def cut_decoder(decoder: Any) -> tuple[Any, Any]:
    """The generator (cut_at_generator's decoder, its upsamplings still transposed convolutions) ->
    (head, tail), cut at the second upsampling's input: the head is conv_pre and the first stage
    (``latent`` -> ``upsampled`` [1, C, F * upsample_rates[0]]), the tail the later stages and
    conv_post (``upsampled`` -> the audio). Together they run every node once.

    The tail's layers reach only a frame or so around each output sample at its input's rate
    (windows.decoder_tail_context), so the CPU runs it over chunks of frames whose activations stay
    in the core's caches, where the whole tail streams each [32, 256 * F] activation through memory
    between nodes (engine/exported.py).
    """
    from onnx import TensorProto, helper

    graph = decoder.graph
    upsamplings = [n for n in graph.node if n.op_type == "ConvTranspose"]
    if len(upsamplings) < 2 or not any(i.name == LATENT_NAME for i in graph.input):
        raise ConversionError(
            f"{len(upsamplings)} ConvTranspose node(s) or no {LATENT_NAME} input: not a Piper VITS generator"
        )
    cut = upsamplings[1].input[0]
    if not any(v.name == cut for v in graph.value_info):  # the extractor looks its inputs up there
        graph.value_info.append(
            helper.make_tensor_value_info(cut, TensorProto.FLOAT, [1, "channels", "positions"])
        )
    return _cut(decoder, cut, UPSAMPLED_NAME)


def _cut(model: Any, cut: str, name: str) -> tuple[Any, Any]:
    """``model`` cut at the tensor ``cut`` into (what computes it from the model's inputs, what
    computes the model's outputs from it), the tensor renamed ``name`` in both."""
    import onnx.utils

    extractor = onnx.utils.Extractor(model)
    before = extractor.extract_model([i.name for i in model.graph.input], [cut])
    after = extractor.extract_model([cut], [o.name for o in model.graph.output])
    for part in (before, after):
        _rename(part, {cut: name})
    return before, after


def _rename(part: Any, renames: dict[str, str]) -> None:
    """Tensors of an extracted part renamed, wherever its nodes, inputs and outputs name them."""
    for node in part.graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]
        node.output[:] = [renames.get(o, o) for o in node.output]
    for value in [*part.graph.input, *part.graph.output]:
        value.name = renames.get(value.name, value.name)


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
    for part in (first_part, second_part):
        _rename(part, {prior: PRIOR_NAME, mask: MASK_NAME})
    return first_part, second_part


def split_couplings(flow: Any) -> list[Any]:
    """The flow (split_flow's second part) -> one ModelProto per coupling layer, in the order they run,
    so a stream can run the flow one coupling layer at a time (windows.flow_runs): each reads
    ``prior`` (the flow's input, or the layer before's output) and ``frame_mask`` and gives out
    ``latent`` (the next layer's input, or the flow's output), the flips of channels between the
    layers going with the layer before them.

    Found by structure: a coupling layer starts where it splits its input into halves (a Split node
    under the flow's scope); the cuts are those Splits' inputs. Together the parts run every node of
    the flow once.
    """
    import onnx.utils

    graph = flow.graph
    cuts = [n.input[0] for n in graph.node if n.op_type == "Split" and n.name.startswith(_FLOW_SCOPE)]
    if not cuts:
        raise ConversionError(f"no Split node under {_FLOW_SCOPE}: not a Piper VITS flow")
    bounds = [PRIOR_NAME, *cuts[1:], LATENT_NAME]
    extractor = onnx.utils.Extractor(flow)
    parts = []
    for a, b in itertools.pairwise(bounds):
        part = extractor.extract_model([a, MASK_NAME], [b])
        _rename(part, {a: PRIOR_NAME, b: LATENT_NAME})
        parts.append(part)
    ran = [n.name for part in parts for n in part.graph.node if n.op_type != "Constant"]
    if sorted(ran) != sorted(n.name for n in graph.node if n.op_type != "Constant"):
        raise ConversionError("the flow's coupling layers do not run each of its nodes once")
    return parts


def prepare_encoder(encoder: Any) -> Any:
    """The encoder as the onnx engine runs it: noise fed from an input (feed_noise), the frames of
    each phoneme id given out (expose_durations), the attention's relative terms over their window
    (banded_attention). Idempotent, so an encoder split before any of them existed is brought up to
    date at load."""
    return banded_attention(expose_durations(feed_noise(encoder)))


def prepare_decoder(decoder: Any) -> tuple[Any, Any]:
    """The generator (cut_at_generator's decoder, nothing rewritten) as the onnx engine runs it: cut
    after its first upsampling stage (cut_decoder), each part's upsamplings as convolutions
    (polyphase_upsampling), and its convolutions 2-D (planar_convolutions)."""
    head, tail = cut_decoder(decoder)
    return planar_convolutions(polyphase_upsampling(head)), planar_convolutions(polyphase_upsampling(tail))


_ATTENTION_SCOPE = "/enc_p/encoder/attn_layers."  # the export names each layer's nodes after its module


def banded_attention(encoder: Any) -> Any:
    """The encoder with each attention layer's relative-position terms computed over the 2w + 1 offsets
    that have embeddings (w = window_size, 4 in Piper's voices) instead of all 2T - 1.

    VITS pads emb_rel_k and emb_rel_v with zeros to 2T - 1 offsets, multiplies the queries by the keys'
    [T, 2T - 1] (a [T, 2T - 1] result, all but 2w + 1 columns zeros), and turns the attention weights
    [T, T] into [T, 2T - 1] columns to multiply by the values' (all but 2w + 1 rows zeros). Here the
    queries meet the 2w + 1 key embeddings alone ([T, 2w + 1]), padded and skewed into [T, T] (row i
    moved i places right: pad to T + 2w + 1, flatten, drop T, view as [T, T + 2w]); and the weights'
    band is skewed out of [T, T] ([T, 2w + 1]: row i moved i places left) for the 2w + 1 value
    embeddings. The same products and sums, none of them the zeros': the same samples (compared exactly,
    tests/system/test_engines.py), and a 348-character sentence's prior in 0.74x the time on two
    threads, 0.70x on one (docs/benchmarks.md, "The attention's relative terms over their window").

    A layer found by the export's node names within its scope; a graph without them (already banded,
    or not Piper's export) is returned as it is.
    """
    from onnx import numpy_helper

    graph = encoder.graph
    nodes = {n.name: n for n in graph.node}
    weights = {i.name: i for i in graph.initializer}
    layers = sorted(
        {
            n.name[len(_ATTENTION_SCOPE) :].split("/")[0]
            for n in graph.node
            if n.name.startswith(_ATTENTION_SCOPE)
        }
    )
    plans = []
    for layer in layers:
        scope = f"{_ATTENTION_SCOPE}{layer}/"
        # MatMul_1: queries x the keys' padded embeddings; Add_1 adds its [T, T] to the scores;
        # Pad_3 reads the attention weights; Add_3 adds their relative part to the output; Pad and
        # Pad_5 pad emb_rel_k and emb_rel_v.
        names = [scope + name for name in ("MatMul_1", "Add_1", "Pad_3", "Add_3", "Pad", "Pad_5")]
        if not all(name in nodes for name in names):
            continue
        logits, add_keys, pad_weights, add_values, pad_k, pad_v = (nodes[name] for name in names)
        if pad_k.input[0] not in weights or pad_v.input[0] not in weights:
            continue
        emb_k = numpy_helper.to_array(weights[pad_k.input[0]])  # [H|1, 2w + 1, Dk]
        emb_v = numpy_helper.to_array(weights[pad_v.input[0]])  # read as it is by the band's MatMul
        if emb_k.ndim != 3 or emb_k.shape != emb_v.shape or emb_k.shape[1] % 2 != 1:
            continue
        plans.append(
            (layer, logits.input[0], pad_weights.input[0], add_keys, add_values, emb_k, pad_v.input[0])
        )
    if not plans:
        return encoder

    def ints(name: str, values: list[int]) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    shared = _BandConstants(
        ints("band/0", [0]),
        ints("band/1", [1]),
        ints("band/2", [2]),
        ints("band/3", [3]),
        ints("band/1,-1", [1, -1]),
    )
    before: dict[str, list[Any]] = {}  # node name -> the new nodes that go just before it
    for layer, queries, attention, add_keys, add_values, emb_k, values_weight in plans:
        p = f"band/{layer}/"
        band, w = emb_k.shape[1], emb_k.shape[1] // 2
        graph.initializer.append(
            numpy_helper.from_array(np.ascontiguousarray(emb_k.transpose(0, 2, 1)), p + "emb_k_t")
        )
        sizes = (ints(p + "band", [band]), ints(p + "w", [w]), ints(p + "2w", [band - 1]))
        keys, values = _band_nodes(p, queries, attention, values_weight, shared, *sizes)
        add_keys.input[1] = p + "k_logits"
        add_values.input[1] = p + "v_relative"
        before[add_keys.name] = keys
        before[add_values.name] = values
    ordered = [new for n in graph.node for new in [*before.get(n.name, []), n]]
    # What no output depends on any more (the padded embeddings, the [T, 2T - 1] products) goes.
    live = {o.name for o in graph.output}
    kept = []
    for n in reversed(ordered):
        if any(o in live for o in n.output):
            kept.append(n)
            live.update(n.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    _drop_unread_weights(graph)
    return encoder


@dataclass(frozen=True)
class _BandConstants:
    """banded_attention's int64 constants [1], by the names of their initializers."""

    zero: str
    one: str
    two: str
    three: str
    batch_heads: str  # [1, -1]


def _band_nodes(
    p: str, queries: str, attention: str, emb_v: str, c: _BandConstants, band: str, w: str, two_w: str
) -> tuple[list[Any], list[Any]]:
    """One layer's new nodes (names prefixed ``p``): those before the scores' Add, ending in
    ``p + "k_logits"`` [1, H, T, T], and those before the output's Add, ending in ``p + "v_relative"``
    [1, H, T, Dk]. ``emb_v``: the value embeddings' initializer [H|1, 2w + 1, Dk]; ``band``, ``w``,
    ``two_w``: the names of 2w + 1, w and 2w."""
    from onnx import helper

    def node(op: str, inputs: list[str], out: str, **attrs: Any) -> Any:
        return helper.make_node(op, inputs, [p + out], name=p + out, **attrs)

    keys = [
        node("Shape", [queries], "q_shape"),
        node("Slice", [p + "q_shape", c.two, c.three], "T"),  # queries [1, H, T, Dk]
        node("Add", [p + "T", two_w], "T+2w"),
        node("Mul", [p + "T", p + "T+2w"], "T*(T+2w)"),
        node("Add", [w, p + "T"], "w+T"),
        node("MatMul", [queries, p + "emb_k_t"], "k_band"),  # [1, H, T, 2w + 1]
        node("Concat", [c.zero] * 7 + [p + "T"], "k_pads", axis=0),
        node("Pad", [p + "k_band", p + "k_pads"], "k_padded"),  # [1, H, T, T + 2w + 1]
        node("Flatten", [p + "k_padded"], "k_flat", axis=2),  # [H, T * (T + 2w + 1)]
        node("Slice", [p + "k_flat", c.zero, p + "T*(T+2w)", c.one], "k_cut"),  # T fewer
        node("Concat", [c.batch_heads, p + "T", p + "T+2w"], "k_shape", axis=0),
        node("Reshape", [p + "k_cut", p + "k_shape"], "k_skewed"),  # [1, H, T, T + 2w], row i i right
        node("Slice", [p + "k_skewed", w, p + "w+T", c.three], "k_logits"),  # [1, H, T, T]
    ]
    values = [
        node("Concat", [c.zero] * 3 + [w] + [c.zero] * 3 + [w], "v_pads", axis=0),
        node("Pad", [attention, p + "v_pads"], "v_padded"),  # [1, H, T, T + 2w]
        node("Flatten", [p + "v_padded"], "v_flat", axis=2),  # [H, T * (T + 2w)]
        node("Concat", [c.zero] * 3 + [p + "T"], "v_pads_flat", axis=0),
        node("Pad", [p + "v_flat", p + "v_pads_flat"], "v_longer"),  # T more
        node("Add", [p + "T+2w", c.one], "T+2w+1"),
        node("Concat", [c.batch_heads, p + "T", p + "T+2w+1"], "v_shape", axis=0),
        node("Reshape", [p + "v_longer", p + "v_shape"], "v_skewed"),  # [1, H, T, T + 2w + 1], i left
        node("Slice", [p + "v_skewed", c.zero, band, c.three], "v_band"),  # [1, H, T, 2w + 1]
        node("MatMul", [p + "v_band", emb_v], "v_relative"),  # [1, H, T, Dk]
    ]
    return keys, values


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


def polyphase_upsampling(decoder: Any) -> Any:
    """The decoder with each 1-D ConvTranspose (HiFi-GAN's upsampling) run as a Conv over its input.

    A transposed convolution of stride s, kernel K = m*s and padding p = (K - s) / 2 gives output
    sample s*q + r (phase r) from m input frames near q: y[s*q + r] = sum_j W[s*j + b] @ x[q + a - j],
    with r + p = s*a + b. So one Conv with s*Cout output channels (phase-major) over x, its taps
    spanning every phase's offsets a (m + 1 taps where the phases' offsets differ, the missing one
    zero), computes every phase at once, and a Reshape/Transpose interleaves them. onnxruntime runs a
    ConvTranspose as a GEMM into an s-times-larger column buffer and a single scatter (col2im); the
    Conv is one GEMM of a better shape: the decoder's three upsamplings 21 -> 12 ms of a 300-frame
    window on two threads (docs/benchmarks.md). The sums are the same products in another order
    (the audio within 2e-7). A node of another shape is left as it is; so is a decoder without one.
    """
    import numpy as np
    from onnx import helper, numpy_helper

    graph = decoder.graph
    weights = {i.name: i for i in graph.initializer}
    nodes: list[Any] = []
    for node in graph.node:
        shape = _plain_upsampling(node, weights)
        if shape is None:
            nodes.append(node)
            continue
        s, k, p = shape
        m = k // s
        w = numpy_helper.to_array(weights[node.input[1]])  # [Cin, Cout, K]
        bias = numpy_helper.to_array(weights[node.input[2]])  # [Cout]
        c_in, c_out, _ = w.shape
        offsets = [(r + p) // s for r in range(s)]  # a of each phase r
        low = min(offsets)
        taps = max(offsets) - low + m
        phases = np.zeros((s, c_out, c_in, taps), dtype=w.dtype)  # [phase r, Cout, Cin, tap]
        for r in range(s):
            a, b = divmod(r + p, s)
            for j in range(m):
                # tap u reads x[q + u - (m - 1 - low)] = x[q + a - j]
                phases[r, :, :, a - low + m - 1 - j] = w[:, :, s * j + b].T
        name, out = node.name, node.output[0]
        graph.initializer.extend(
            [
                numpy_helper.from_array(phases.reshape(s * c_out, c_in, taps), f"{name}/phases/weight"),
                numpy_helper.from_array(np.tile(bias, s), f"{name}/phases/bias"),
                numpy_helper.from_array(np.array([0, s, c_out, -1], dtype=np.int64), f"{name}/by_phase"),
                numpy_helper.from_array(np.array([0, c_out, -1], dtype=np.int64), f"{name}/interleaved"),
            ]
        )
        left = m - 1 - low
        nodes += [
            # [1, Cin, T] -> [1, s*Cout, T]: channel r*Cout + c is output channel c at phase r
            helper.make_node(
                "Conv",
                [node.input[0], f"{name}/phases/weight", f"{name}/phases/bias"],
                [f"{name}/phases"],
                name=f"{name}/Phases",
                kernel_shape=[taps],
                pads=[left, taps - 1 - left],
                strides=[1],
                dilations=[1],
                group=1,
            ),
            # -> [1, s, Cout, T] -> [1, Cout, T, s] -> [1, Cout, T*s]
            helper.make_node(
                "Reshape",
                [f"{name}/phases", f"{name}/by_phase"],
                [f"{name}/by_phase_out"],
                name=f"{name}/ByPhase",
            ),
            helper.make_node(
                "Transpose",
                [f"{name}/by_phase_out"],
                [f"{name}/interleave"],
                name=f"{name}/Interleave",
                perm=[0, 2, 3, 1],
            ),
            helper.make_node(
                "Reshape", [f"{name}/interleave", f"{name}/interleaved"], [out], name=f"{name}/Interleaved"
            ),
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    # The transposed convolutions' own weights, read by nothing now (onnxruntime warns of each at load).
    _drop_unread_weights(graph)
    return decoder


_PLANAR_SCOPE = "/planar/"  # the names of what planar_convolutions adds


def planar_convolutions(model: Any) -> Any:
    """The model with each 1-D Conv of constant weights run as a 2-D one over a height of one: its
    input unsqueezed to [N, C, 1, L], its weights to [Cout, Cin, 1, K], its output squeezed back.

    onnxruntime runs a 1-D convolution as im2col and a GEMM whatever the optimization level; a 2-D one,
    at ORT_ENABLE_ALL on CPU, in channel blocks of the vector width (its NCHWc layout) with direct
    kernels, the reorders between layouts placed once around each run of such convolutions and the
    Unsqueeze/Squeeze pairs between them removed. One thread, this decoder: the tail 0.85x, the head
    0.91x (docs/benchmarks.md, "The decoder's convolutions in 2-D"). The same products summed in
    another order (the audio within 1e-5). At lower levels the 2-D nodes run as the 1-D ones did.
    Idempotent: a 2-D Conv is left as it is."""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {i.name: i for i in graph.initializer}
    axis = f"{_PLANAR_SCOPE}axis"
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    # Unsqueeze and Squeeze read their axes from an input since opset 13, from an attribute before.
    axes: dict[str, Any] = {} if opset >= 13 else {"axes": [2]}
    if opset >= 13 and axis not in weights:
        graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), axis))
    planar: set[str] = set()  # weights already [Cout, Cin, 1, K]
    nodes: list[Any] = []
    for node in graph.node:
        weight = weights.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        attrs = _attrs(node) if weight is not None else {}
        if (
            weight is None
            or (len(weight.dims) != 3 and weight.name not in planar)
            or attrs.get("auto_pad", b"NOTSET") != b"NOTSET"
        ):
            nodes.append(node)
            continue
        if weight.name not in planar:
            w = numpy_helper.to_array(weight)
            weight.CopyFrom(numpy_helper.from_array(w[:, :, None, :], weight.name))
            planar.add(weight.name)
        (k,) = attrs.get("kernel_shape", weight.dims[-1:])
        (left, right) = attrs.get("pads", [0, 0])
        del node.attribute[:]
        node.attribute.extend(
            [
                helper.make_attribute("kernel_shape", [1, k]),
                helper.make_attribute("pads", [0, left, 0, right]),
                helper.make_attribute("strides", [1, *attrs.get("strides", [1])]),
                helper.make_attribute("dilations", [1, *attrs.get("dilations", [1])]),
                helper.make_attribute("group", attrs.get("group", 1)),
            ]
        )
        x, y = node.input[0], node.output[0]  # named after y: an output's name is unique, a node's may be ""
        node.input[0], node.output[0] = f"{_PLANAR_SCOPE}{y}/in", f"{_PLANAR_SCOPE}{y}/out"
        read = [axis] if not axes else []
        nodes += [
            helper.make_node("Unsqueeze", [x, *read], [node.input[0]], name=f"{_PLANAR_SCOPE}{y}/Up", **axes),
            node,  # [N, Cin, 1, L] -> [N, Cout, 1, L']
            helper.make_node(
                "Squeeze", [node.output[0], *read], [y], name=f"{_PLANAR_SCOPE}{y}/Down", **axes
            ),
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _drop_unread_weights(graph: Any) -> None:
    """The graph without the initializers no node reads."""
    read = {i for n in graph.node for i in n.input}
    kept = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _plain_upsampling(node: Any, weights: dict[str, Any]) -> tuple[int, int, int] | None:
    """(stride, kernel, padding) of a 1-D ConvTranspose polyphase_upsampling can rewrite (constant
    weights and bias, no groups, dilation or output padding, kernel a multiple of the stride, output
    exactly stride x input); None for any other node."""
    if (
        node.op_type != "ConvTranspose"
        or len(node.input) != 3
        or not all(i in weights for i in node.input[1:])
    ):
        return None
    attrs = _attrs(node)
    kernel, strides = attrs.get("kernel_shape", []), attrs.get("strides", [1])
    pads = attrs.get("pads", [0, 0])
    if len(kernel) != 1 or len(strides) != 1 or len(pads) != 2 or pads[0] != pads[1]:
        return None
    (k,), (s,), p = kernel, strides, pads[0]
    plain = (
        attrs.get("group", 1) == 1
        and list(attrs.get("dilations", [1])) == [1]
        and not any(attrs.get("output_padding", [0]))
        and k % s == 0
        and k - 2 * p == s
    )
    return (s, k, p) if plain else None
