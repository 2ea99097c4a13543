"""Publish-time conversion of a Piper ONNX voice: VITS state dict (safetensors) + VitsConfig read from the
graph itself, and the graph split into encoder and decoder (engine/exported_graph.py, which needs no
torch). The engines load the results through
engine/voice_files.py; nothing here runs in a serving process except for an artifact published
before the split existed (engine/exported.py then splits it in memory).

The exported graph is the only artifact a Piper voice ships, so it is the ground truth for both the
weights and the hyperparameters:

  * Named initializers carry their PyTorch parameter names (``enc_p.proj.weight``...).
  * Weight norm was folded at export; the folded weights of the flow's WaveNet convolutions lost
    their names (``onnx::Conv_8168``), so every Conv/ConvTranspose weight and bias is named after the
    node that consumes it: ``/flow/flows.6/enc/in_layers.0/Conv`` -> ``flow.flows.6.enc.in_layers.0``.
  * The phoneme embedding is whatever ``/enc_p/emb/Gather`` reads (Piper's single-speaker export names
    that initializer ``sid``).
  * ``dp.flows.0.logs`` survives only folded into a constant exp(-logs) feeding ``/dp/flows.0/Mul``.
  * Hyperparameters come from initializer shapes and node attributes (strides, dilations, the spline's
    tail bound). The built module is then checked against every Conv node's attributes and loaded
    with strict=True, so any missing, unexpected or mis-shaped tensor fails the conversion.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictor.engine.exported_graph import ConversionError, split_couplings, split_flow, split_onnx
from predictor.engine.vits import Vits, VitsConfig
from predictor.engine.voice_files import (
    CONFIG_FILE,
    DECODER_HEAD_ONNX,
    DECODER_TAIL_ONNX,
    PRIOR_ONNX,
    WEIGHTS_FILE,
    flow_stage_files,
)

_CONV_OPS = ("Conv", "ConvTranspose")
_EMBEDDING_NODE = "/enc_p/emb/Gather"
_DP_AFFINE_NODE = "/dp/flows.0/Mul"  # (z - m) * exp(-logs): the reverse ElementwiseAffine


def _module_path(node_name: str) -> str:
    """'/flow/flows.6/enc/in_layers.0/Conv' -> 'flow.flows.6.enc.in_layers.0'."""
    parts = node_name.strip("/").split("/")
    if len(parts) < 2:
        raise ConversionError(f"node {node_name!r} does not name the module that owns it")
    return ".".join(parts[:-1])


def _is_parameter_name(name: str) -> bool:
    """Exporter constants are '/scope/Op_output_0', 'onnx::Op_123' or bare numbers; parameters are dotted."""
    return not (name.startswith(("/", "onnx::")) or name.isdigit())


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _load_graph(onnx_model: Any) -> Any:
    import onnx
    from onnx import numpy_helper

    model = onnx_model if isinstance(onnx_model, onnx.ModelProto) else onnx.load(str(onnx_model))
    graph = model.graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and "value" in (attrs := _attrs(node)):
            constants[node.output[0]] = numpy_helper.to_array(attrs["value"])
    return graph, constants


def _collect_tensors(graph: Any, constants: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}

    def put(name: str, value: np.ndarray, source: str) -> None:
        if name in tensors and not np.array_equal(tensors[name], value):
            raise ConversionError(f"{name} is bound to two different tensors (second from {source})")
        tensors[name] = value

    consumed: set[str] = set()
    nodes = {node.name: node for node in graph.node}
    for node in graph.node:
        if node.op_type in _CONV_OPS:
            module = _module_path(node.name)
            for slot, kind in ((1, "weight"), (2, "bias")):
                if len(node.input) <= slot or not node.input[slot]:
                    continue
                source = node.input[slot]
                if source not in constants:
                    raise ConversionError(f"{node.name} reads its {kind} from a computed tensor {source!r}")
                name = f"{module}.{kind}"
                if _is_parameter_name(source) and source != name:
                    raise ConversionError(f"{node.name} consumes {source!r} but its scope says {name!r}")
                put(name, constants[source], source)
                consumed.add(source)

    emb = nodes.get(_EMBEDDING_NODE)
    if emb is None or emb.input[0] not in constants:
        raise ConversionError(f"no {_EMBEDDING_NODE} node reading the phoneme embedding")
    put("enc_p.emb.weight", constants[emb.input[0]], emb.input[0])
    consumed.add(emb.input[0])

    # Remaining parameters are named initializers used outside convolutions (LayerNorm, relative
    # attention tables, the duration flow's affine).
    for init in graph.initializer:
        if init.name not in consumed and _is_parameter_name(init.name):
            put(init.name, constants[init.name], init.name)

    if "dp.flows.0.logs" not in tensors:
        node = nodes.get(_DP_AFFINE_NODE)
        folded = [i for i in (node.input if node else []) if i in constants]
        if len(folded) != 1:
            raise ConversionError(
                f"cannot find the folded exp(-dp.flows.0.logs) constant at {_DP_AFFINE_NODE}"
            )
        scale = constants[folded[0]].astype(np.float64)
        if (scale <= 0).any():
            raise ConversionError("folded exp(-logs) constant is not positive")
        # The graph multiplies by exp(-logs) (the reverse affine), so logs = -log(constant).
        put("dp.flows.0.logs", (-np.log(scale)).astype(np.float32), folded[0])
    return tensors


def _indices(tensors: dict, pattern: str) -> list[int]:
    regex = re.compile(pattern)
    return sorted({int(m.group(1)) for name in tensors if (m := regex.match(name))})


def _infer_config(graph: Any, tensors: dict[str, np.ndarray], constants: dict[str, np.ndarray]) -> VitsConfig:
    nodes = {node.name: node for node in graph.node}
    if any(i.name == "sid" for i in graph.input) or "emb_g.weight" in tensors:
        raise ConversionError("multi-speaker voices (speaker id input / emb_g) are not supported")

    def shape(name: str) -> tuple[int, ...]:
        if name not in tensors:
            raise ConversionError(f"expected tensor {name} is missing from the graph")
        return tuple(tensors[name].shape)

    def conv_attr(node_name: str, attr: str) -> list[int]:
        if node_name not in nodes:
            raise ConversionError(f"expected node {node_name} is missing from the graph")
        return list(_attrs(nodes[node_name])[attr])

    n_vocab, hidden = shape("enc_p.emb.weight")
    inter = shape("enc_p.proj.weight")[0] // 2
    filter_channels, _, kernel_size = shape("enc_p.encoder.ffn_layers.0.conv_1.weight")
    n_layers = len(_indices(tensors, r"enc_p\.encoder\.attn_layers\.(\d+)\."))
    n_heads_rel, n_offsets, k_channels = shape("enc_p.encoder.attn_layers.0.emb_rel_k")

    dp_filter = shape("dp.pre.weight")[0]
    dp_kernel = shape("dp.convs.convs_sep.0.weight")[2]
    dp_layers = len(_indices(tensors, r"dp\.convs\.convs_sep\.(\d+)\."))
    # ConvFlows sit at odd indices 1, 3, ..., 2n-1 (1 is the training-only one, absent).
    dp_conv_flows = _indices(tensors, r"dp\.flows\.(\d+)\.pre\.")
    dp_n_flows = (max(dp_conv_flows) + 1) // 2
    half = shape(f"dp.flows.{dp_conv_flows[0]}.pre.weight")[1]
    proj_out = shape(f"dp.flows.{dp_conv_flows[0]}.proj.weight")[0]
    dp_num_bins = (proj_out // half + 1) // 3  # half * (3K - 1) spline parameters
    # The spline's tail bound is the upper limit of its "inside the interval" test.
    bounds = [
        float(constants[i])
        for n in graph.node
        if n.op_type == "LessOrEqual" and n.name.startswith("/dp/flows.")
        for i in n.input
        if i in constants
    ]
    if not bounds or len(set(bounds)) != 1:
        raise ConversionError(f"cannot read the duration spline's tail bound (found {bounds})")

    couplings = _indices(tensors, r"flow\.flows\.(\d+)\.pre\.")
    first = couplings[0]
    flow_layers = len(_indices(tensors, rf"flow\.flows\.{first}\.enc\.in_layers\.(\d+)\."))
    flow_kernel = shape(f"flow.flows.{first}.enc.in_layers.0.weight")[2]
    flow_dilation = (
        conv_attr(f"/flow/flows.{first}/enc/in_layers.1/Conv", "dilations")[0] if flow_layers > 1 else 1
    )

    n_ups = len(_indices(tensors, r"dec\.ups\.(\d+)\."))
    upsample_rates = [conv_attr(f"/dec/ups.{i}/ConvTranspose", "strides")[0] for i in range(n_ups)]
    upsample_kernels = [shape(f"dec.ups.{i}.weight")[2] for i in range(n_ups)]
    n_kernels = len(_indices(tensors, r"dec\.resblocks\.(\d+)\.")) // n_ups
    resblock = "1" if "dec.resblocks.0.convs1.0.weight" in tensors else "2"
    dilated = "convs1" if resblock == "1" else "convs"
    resblock_kernels, resblock_dilations = [], []
    for j in range(n_kernels):
        n_convs = len(_indices(tensors, rf"dec\.resblocks\.{j}\.{dilated}\.(\d+)\."))
        resblock_kernels.append(shape(f"dec.resblocks.{j}.{dilated}.0.weight")[2])
        resblock_dilations.append(
            [conv_attr(f"/dec/resblocks.{j}/{dilated}.{c}/Conv", "dilations")[0] for c in range(n_convs)]
        )

    return VitsConfig(
        n_vocab=n_vocab,
        hidden_channels=hidden,
        filter_channels=filter_channels,
        n_heads=hidden // k_channels,
        n_layers=n_layers,
        kernel_size=kernel_size,
        window_size=(n_offsets - 1) // 2,
        heads_share=n_heads_rel == 1,
        inter_channels=inter,
        dp_filter_channels=dp_filter,
        dp_kernel_size=dp_kernel,
        dp_n_layers=dp_layers,
        dp_n_flows=dp_n_flows,
        dp_num_bins=dp_num_bins,
        dp_tail_bound=bounds[0],
        flow_n_flows=len(couplings),
        flow_hidden_channels=shape(f"flow.flows.{first}.pre.weight")[0],
        flow_kernel_size=flow_kernel,
        flow_dilation_rate=flow_dilation,
        flow_n_layers=flow_layers,
        resblock=resblock,
        resblock_kernel_sizes=resblock_kernels,
        resblock_dilation_sizes=resblock_dilations,
        upsample_rates=upsample_rates,
        upsample_initial_channel=shape("dec.conv_pre.weight")[0],
        upsample_kernel_sizes=upsample_kernels,
    )


def _check_conv_attributes(vits: Vits, graph: Any) -> None:
    """Every Conv/ConvTranspose node must match the module it maps to: kernel, stride, dilation,
    padding and groups (catches a hyperparameter the shapes alone cannot reveal)."""
    modules = dict(vits.named_modules())
    for node in graph.node:
        if node.op_type not in _CONV_OPS:
            continue
        path = _module_path(node.name)
        module = modules.get(path)
        if not isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            raise ConversionError(f"{node.name} has no convolution module {path} in Vits")
        # ONNX defaults for absent attributes: stride 1, dilation 1, group 1, no padding.
        attrs = {"strides": [1], "dilations": [1], "group": 1, "pads": [0, 0], **_attrs(node)}
        expected = {
            "kernel_shape": list(module.kernel_size),
            "strides": list(module.stride),
            "dilations": list(module.dilation),
            "group": module.groups,
            "pads": list(module.padding) * 2,  # [begin, end]
        }
        for key, want in expected.items():
            if attrs.get(key) != want:
                raise ConversionError(f"{node.name}: {key} {attrs.get(key)} in the graph, {want} in {path}")


def onnx_to_state_dict(onnx_path: str | Path) -> tuple[dict[str, torch.Tensor], VitsConfig]:
    """Map the exported graph (a path, or an onnx.ModelProto) onto Vits' parameter names and infer
    its VitsConfig.

    Raises ConversionError on any missing, unexpected or mis-shaped tensor, or on a convolution whose
    attributes differ from the built module.
    """
    graph, constants = _load_graph(onnx_path)
    tensors = _collect_tensors(graph, constants)
    config = _infer_config(graph, tensors, constants)
    state = {
        name: torch.from_numpy(np.array(value, dtype=np.float32, order="C", copy=True))
        for name, value in tensors.items()
    }
    vits = Vits(config)
    _check_conv_attributes(vits, graph)
    try:
        vits.load_state_dict(state, strict=True)  # missing / unexpected / mis-shaped keys
    except RuntimeError as exc:
        raise ConversionError(f"the graph's tensors do not fit Vits: {exc}") from exc
    return state, config


def write_safetensors(onnx_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Write model.safetensors (fp32) and vits.json (VitsConfig) into out_dir; returns both paths."""
    from safetensors.torch import save_file

    state, config = onnx_to_state_dict(onnx_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / WEIGHTS_FILE
    config_path = out_dir / CONFIG_FILE
    save_file({k: v.float().contiguous() for k, v in state.items()}, str(weights))
    config_path.write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
    return [weights, config_path]


def write_onnx_split(onnx_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Write prior.onnx, the flow's coupling layers (flow_0.onnx, ...), decoder_head.onnx and
    decoder_tail.onnx (split_onnx, then split_flow and split_couplings) into out_dir; returns their
    paths."""
    from predictor.storage.files import atomic_write_bytes

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    encoder, head, tail = split_onnx(onnx_path)
    prior, flow = split_flow(encoder)
    couplings = split_couplings(flow)
    names = (PRIOR_ONNX, *flow_stage_files(len(couplings)), DECODER_HEAD_ONNX, DECODER_TAIL_ONNX)
    paths = []
    for part, name in zip((prior, *couplings, head, tail), names, strict=True):
        path = out_dir / name
        atomic_write_bytes(path, part.SerializeToString())
        paths.append(path)
    return paths


def infer_config(onnx_model: Any) -> VitsConfig:
    """The VitsConfig read off Piper's graph (for artifacts without vits.json)."""
    graph, constants = _load_graph(onnx_model)
    return _infer_config(graph, _collect_tensors(graph, constants), constants)
