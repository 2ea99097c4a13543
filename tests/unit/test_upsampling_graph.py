"""The decoder's transposed convolutions rewritten as convolutions (engine/exported_graph.py,
polyphase_upsampling): the same output on onnxruntime, for the shapes HiFi-GAN uses and others. The
voice's own published decoder against its untouched one: system/test_engines.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from predictor.engine.exported_graph import polyphase_upsampling


def _upsampling(
    c_in: int, c_out: int, kernel: int, stride: int, pad: int, seed: int, **extra
) -> onnx.ModelProto:
    """x [1, Cin, T] -> LeakyRelu -> ConvTranspose -> y, with random weights."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((c_in, c_out, kernel)).astype(np.float32) * 0.1
    b = rng.standard_normal(c_out).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("LeakyRelu", ["x"], ["h"], alpha=0.1),
            helper.make_node(
                "ConvTranspose",
                ["h", "w", "b"],
                ["y"],
                name="/dec/ups.0/ConvTranspose",
                kernel_shape=[kernel],
                strides=[stride],
                pads=[pad, pad],
                dilations=[1],
                group=1,
                **extra,
            ),
        ],
        "ups",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_out, "S"])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize(
    ("c_in", "c_out", "kernel", "stride", "pad"),
    [
        (16, 8, 16, 8, 4),  # the joe voice's first two upsamplings (x8)
        (8, 4, 8, 4, 2),  # its last (x4)
        (8, 4, 4, 2, 1),  # x2: every phase reads the same two frames
        (6, 5, 9, 3, 3),  # x3 with three taps a phase
        (4, 4, 2, 2, 0),  # no padding: kernel == stride
    ],
)
@pytest.mark.parametrize("frames", [1, 7, 64])
def test_the_upsampling_as_a_convolution_gives_the_transposed_convolutions_output(
    c_in, c_out, kernel, stride, pad, frames
):
    original = _upsampling(c_in, c_out, kernel, stride, pad, seed=kernel * 100 + frames)
    x = np.random.default_rng(frames).standard_normal((1, c_in, frames)).astype(np.float32)
    expected = _run(original, x)
    rewritten = polyphase_upsampling(
        _upsampling(c_in, c_out, kernel, stride, pad, seed=kernel * 100 + frames)
    )
    assert "ConvTranspose" not in {n.op_type for n in rewritten.graph.node}
    got = _run(rewritten, x)
    assert got.shape == expected.shape == (1, c_out, frames * stride)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_the_rewrite_drops_the_transposed_convolutions_weights():
    rewritten = polyphase_upsampling(_upsampling(8, 4, 8, 4, 2, seed=1))
    assert {i.name for i in rewritten.graph.initializer}.isdisjoint({"w", "b"})


@pytest.mark.parametrize(
    ("kernel", "stride", "pad", "extra"),
    [
        (7, 4, 2, {}),  # kernel not a multiple of the stride
        (16, 8, 2, {}),  # output longer than stride x input
        (8, 4, 2, {"output_padding": [1]}),
    ],
)
def test_a_transposed_convolution_of_another_shape_is_left_as_it_is(kernel, stride, pad, extra):
    model = _upsampling(8, 4, kernel, stride, pad, seed=2, **extra)
    before = model.SerializeToString()
    assert polyphase_upsampling(model).SerializeToString() == before
