"""The decoder's 1-D convolutions rewritten as 2-D ones over a height of one (engine/exported_graph.py,
planar_convolutions): the same output on onnxruntime with and without its graph optimizations, and,
with them, run in its channel-blocked layout, which is what the rewrite is for. The voice's own
published decoder against its untouched one: system/test_engines.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from predictor.engine.exported_graph import planar_convolutions

C = 16


def _chain(seed: int, opset: int = 17) -> onnx.ModelProto:
    """x [1, C, T] through convolutions of the shapes HiFi-GAN's residual blocks use (dilated, padded to
    keep the length), a strided one, a grouped one, one without bias or kernel_shape, one sharing
    another's weights, two without a name, with the activations and residual sums between them."""
    rng = np.random.default_rng(seed)

    def weights(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name
        )

    initializers = [
        weights("w3", (C, C, 3)),
        weights("b3", (C,)),
        weights("w5", (C, C, 5)),
        weights("b5", (C,)),
        weights("w7", (2 * C, C, 7)),
        weights("wg", (C, 2 * C // 4, 3)),
        weights("ws", (C, C, 4)),
    ]
    nodes = [
        helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
        helper.make_node("Conv", ["a", "w3", "b3"], ["c1"], name="k3", kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Add", ["c1", "x"], ["r1"]),
        helper.make_node("LeakyRelu", ["r1"], ["a1"], alpha=0.1),
        helper.make_node(
            "Conv", ["a1", "w5", "b5"], ["c2"], name="k5d6", kernel_shape=[5], dilations=[6], pads=[12, 12]
        ),
        helper.make_node("Add", ["c2", "r1"], ["r2"]),
        helper.make_node("Conv", ["r2", "w7"], ["c3"], name="k7_no_bias", pads=[3, 3]),  # no kernel_shape
        helper.make_node(
            "Conv", ["c3", "wg"], ["c4"], name="grouped", kernel_shape=[3], pads=[1, 1], group=4
        ),
        helper.make_node("Conv", ["c4", "w3", "b3"], ["c5"], kernel_shape=[3], pads=[1, 1]),  # shares k3's
        helper.make_node(
            "Conv",
            ["c5", "ws"],
            ["y"],
            kernel_shape=[4],
            strides=[2],
            pads=[1, 1],  # strided
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, "S"])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _session(
    model: onnx.ModelProto, level: onnxruntime.GraphOptimizationLevel, optimized: Path | None = None
) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = level
    options.intra_op_num_threads = 1
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    return onnxruntime.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize(
    "level",
    [onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL],
    ids=["unoptimized", "all"],
)
@pytest.mark.parametrize("frames", [2, 7, 64, 301])
@pytest.mark.parametrize("opset", [11, 17], ids=["axes-attribute", "axes-input"])
def test_the_convolutions_in_2d_give_the_1d_ones_output(level, frames, opset):
    x = np.random.default_rng(frames).standard_normal((1, C, frames)).astype(np.float32)
    expected = _session(_chain(seed=3, opset=opset), onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL).run(
        None, {"x": x}
    )[0]
    planar = planar_convolutions(_chain(seed=3, opset=opset))

    convs = [n for n in planar.graph.node if n.op_type == "Conv"]
    assert len(convs) == 6
    assert all(
        len(helper.get_attribute_value(a)) == 2
        for n in convs
        for a in n.attribute
        if a.name == "kernel_shape"
    )
    assert all(len(i.dims) == 4 for i in planar.graph.initializer if i.name.startswith("w"))
    got = _session(planar, level).run(None, {"x": x})[0]
    assert got.shape == expected.shape == (1, C, frames // 2)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def _vector_extensions() -> set[str]:
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return set()
    return set(flags.split()) & {"avx2", "avx512f"}


@pytest.mark.skipif(not _vector_extensions(), reason="onnxruntime blocks channels with AVX2 or AVX-512 only")
def test_onnxruntime_runs_the_2d_convolutions_in_its_blocked_layout_and_the_1d_ones_not(tmp_path):
    def blocked(model: onnx.ModelProto, name: str) -> int:
        _session(model, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, tmp_path / name)
        optimized = onnx.load(str(tmp_path / name))
        return sum(
            1 for n in optimized.graph.node if n.domain == "com.microsoft.nchwc" and n.op_type == "Conv"
        )

    assert blocked(_chain(seed=1), "1d.onnx") == 0
    # The strided and grouped ones too, except where a channel count is not a multiple of the block.
    assert blocked(planar_convolutions(_chain(seed=1)), "2d.onnx") >= 4


def test_the_rewrite_is_idempotent_and_leaves_other_convolutions_as_they_are():
    once = planar_convolutions(_chain(seed=2)).SerializeToString()
    assert planar_convolutions(onnx.load_from_string(once)).SerializeToString() == once

    model = _chain(seed=2)
    for node in model.graph.node:
        if node.name == "k3":  # padding left to onnxruntime: not a shape this rewrite knows
            del node.attribute[:]
            node.attribute.extend(
                [helper.make_attribute("kernel_shape", [3]), helper.make_attribute("auto_pad", "SAME_UPPER")]
            )
        if node.name == "k5d6":  # weights fed at run time: nothing to reshape
            node.input[1] = "x_weights"
    model.graph.input.append(helper.make_tensor_value_info("x_weights", TensorProto.FLOAT, [C, C, 5]))
    kept = {n.name: n.SerializeToString() for n in model.graph.node if n.name in ("k3", "k5d6")}
    rewritten = {n.name: n.SerializeToString() for n in planar_convolutions(model).graph.node}
    assert all(rewritten[name] == node for name, node in kept.items())
