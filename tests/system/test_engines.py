"""The two engines through the Engine interface, and the torch device/precision policy on this CPU.

CUDA cannot exist on these machines; where a policy branch depends on it, torch.cuda's answers are
replaced (and nothing else), so the decisions and error messages are still exercised.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime
import pytest
import soundfile
import torch
from onnxruntime import GraphOptimizationLevel

from predictor.config import ConfigError, load_settings
from predictor.engine import device as devices
from predictor.engine.base import StreamWindows, SynthesisParams
from predictor.engine.exported import OnnxEngine
from predictor.engine.native import TorchEngine
from predictor.errors import BadRequest, EngineError
from testing.artifacts import (
    as_published_before_noise_and_durations,
    as_published_before_the_coupling_cut,
    as_published_before_the_decoder_cut,
    prior_before_banded_attention,
    untouched_decoder,
)
from testing.audio import check_samples
from testing.predictor import run_synth

QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0)
TEXTS = [
    "Hi.",
    "The quick brown fox jumps over the lazy dog. Then it sleeps!",
    "Call 555-0100, ext. 42; ask for Dr. Smith.",
]


@pytest.fixture(scope="module")
def engines(voice_dir):
    torch_engine = TorchEngine(device="cpu", dtype="fp32", threads=2, gpu_memory_fraction=0.0, compile=False)
    torch_engine.load(voice_dir)
    onnx_engine = OnnxEngine(device="cpu", threads=2)
    onnx_engine.load(voice_dir)
    return torch_engine, onnx_engine


# --- engines ---------------------------------------------------------------------------------
def test_torch_engine_matches_onnxruntime_without_noise(engines):
    torch_engine, onnx_engine = engines

    ours = torch_engine.synthesize(TEXTS, QUIET)
    reference = onnx_engine.synthesize(TEXTS, QUIET)

    for a, b in zip(ours, reference, strict=False):
        assert a.shape == b.shape  # same ceiled durations, so the same length
        assert np.abs(a - b).max() <= 1e-3


@pytest.mark.parametrize("per_batch", [1, 16], ids=["one sentence per pass (CPU)", "padded batches (GPU)"])
def test_a_seed_gives_the_same_noisy_audio_on_onnxruntime_as_on_torch(engines, monkeypatch, per_batch):
    torch_engine, onnx_engine = engines
    monkeypatch.setattr(torch_engine, "sentences_per_batch", per_batch)
    seeded = SynthesisParams(seed=2026)  # the voice's own noise_scale 0.667 and noise_w 0.8

    ours = torch_engine.synthesize(TEXTS, seeded)
    reference = onnx_engine.synthesize(TEXTS, seeded)
    unseeded = onnx_engine.synthesize(TEXTS[1:2], SynthesisParams())[0]

    for a, b in zip(ours, reference, strict=True):
        assert a.shape == b.shape  # the same noisy durations, so the same length
        assert np.abs(a - b).max() <= 1e-3
    # Noise that matters: without the seed the same text comes out at another length or other samples.
    assert unseeded.shape != reference[1].shape or np.abs(unseeded - reference[1]).max() > 0.05


def test_onnxruntime_reads_a_longer_noise_feed_for_a_sentence_slower_than_its_first_guess(
    engines, monkeypatch
):
    _, onnx_engine = engines
    seeded = SynthesisParams(seed=7, length_scale=1.0)
    expected = onnx_engine.synthesize(TEXTS[1:2], seeded)[0]

    # One frame a phoneme is far too few for any sentence: every run needs the retry's longer feed.
    monkeypatch.setattr("predictor.engine.exported.FRAMES_PER_PHONEME", 1)
    again = onnx_engine.synthesize(TEXTS[1:2], seeded)[0]

    np.testing.assert_array_equal(again, expected)


@pytest.mark.parametrize("per_batch", [1, 16], ids=["one sentence per pass (CPU)", "padded batches (GPU)"])
def test_texts_batched_together_equal_each_alone(engines, monkeypatch, per_batch):
    torch_engine, _ = engines
    monkeypatch.setattr(torch_engine, "sentences_per_batch", per_batch)

    together = torch_engine.synthesize(TEXTS, QUIET)
    alone = [torch_engine.synthesize([t], QUIET)[0] for t in TEXTS]

    for a, b in zip(together, alone, strict=False):
        assert a.shape == b.shape and np.abs(a - b).max() <= 5e-4


def test_seeded_audio_does_not_depend_on_batching(engines, monkeypatch):
    torch_engine, _ = engines
    seeded = SynthesisParams(seed=99)
    one_by_one = torch_engine.synthesize(TEXTS, seeded)
    monkeypatch.setattr(torch_engine, "sentences_per_batch", 16)

    batched = torch_engine.synthesize(TEXTS, seeded)

    for a, b in zip(one_by_one, batched, strict=False):
        assert a.shape == b.shape and np.abs(a - b).max() <= 5e-4


def test_seed_makes_noise_reproducible(engines):
    torch_engine, _ = engines

    first = torch_engine.synthesize(TEXTS[1:2], SynthesisParams(seed=1234))[0]
    again = torch_engine.synthesize(TEXTS[1:2], SynthesisParams(seed=1234))[0]
    other = torch_engine.synthesize(TEXTS[1:2], SynthesisParams(seed=4321))[0]
    fresh = torch_engine.synthesize(TEXTS[1:2], SynthesisParams())[0]

    np.testing.assert_array_equal(first, again)
    assert other.shape != first.shape or not np.array_equal(other, first)
    assert fresh.shape != first.shape or not np.array_equal(fresh, first)


def test_bf16_decoder_keeps_durations(voice_dir, engines):
    fp32_engine, _ = engines
    bf16_engine = TorchEngine(device="cpu", dtype="bf16", threads=2, gpu_memory_fraction=0.0, compile=False)
    bf16_engine.load(voice_dir)

    a = fp32_engine.synthesize(TEXTS[1:2], QUIET)[0]
    b = bf16_engine.synthesize(TEXTS[1:2], QUIET)[0]

    assert a.shape == b.shape  # durations run in fp32 whatever DTYPE says
    assert np.corrcoef(a, b)[0, 1] > 0.99


def test_unknown_voice_is_refused(engines):
    torch_engine, _ = engines

    with pytest.raises(BadRequest, match="nobody"):
        torch_engine.synthesize(["Hello."], SynthesisParams(voice="nobody"))


def test_cli_synth_files_match_across_engines(voice_dir, tmp_path):
    outs = {}
    for engine in ("torch", "onnx"):
        outs[engine] = tmp_path / f"{engine}.wav"
        run = run_synth(voice_dir, TEXTS[1], outs[engine], "--engine", engine)
        assert run.returncode == 0, run.stderr

    a, rate_a = soundfile.read(outs["torch"], dtype="float32")
    b, rate_b = soundfile.read(outs["onnx"], dtype="float32")

    assert rate_a == rate_b == 22050 and a.shape == b.shape
    assert np.abs(a - b).max() <= 1e-3


# --- device and precision policy -------------------------------------------------------------
def test_cpu_plan_sets_threads():
    plan = devices.plan("cpu", "fp32", threads=2)

    assert plan.device == torch.device("cpu") and plan.decoder_dtype is torch.float32
    assert torch.get_num_threads() == 2


def test_bf16_on_cpu_is_allowed_fp16_is_not():
    assert devices.plan("cpu", "bf16", threads=2).decoder_dtype is torch.bfloat16

    with pytest.raises(EngineError, match="DTYPE=fp16 needs DEVICE=cuda"):
        devices.plan("cpu", "fp16", threads=2)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_a_clear_start_up_error(device):
    assert not torch.cuda.is_available()  # these machines have none; the test is about that case

    with pytest.raises(EngineError, match=f"DEVICE={device} but torch sees no CUDA device"):
        devices.plan(device, "fp32", threads=2)


@pytest.fixture
def two_fake_gpus(monkeypatch):
    """torch.cuda answering as if two cards were visible; records what the plan asked of it."""
    calls: dict[str, object] = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake T4")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("device", d))
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, i=None: calls.setdefault("fraction", (f, i))
    )
    return calls


def test_cuda_plan_caps_memory_on_the_chosen_card(two_fake_gpus):
    plan = devices.plan("cuda:1", "fp16", threads=2, gpu_memory_fraction=0.4)

    assert plan.device == torch.device("cuda", 1) and plan.decoder_dtype is torch.float16
    assert two_fake_gpus["fraction"] == (0.4, 1)
    assert two_fake_gpus["device"] == torch.device("cuda", 1)


def test_cuda_index_past_visible_cards_is_refused(two_fake_gpus):
    with pytest.raises(EngineError, match="only 2 CUDA device"):
        devices.plan("cuda:2", "fp32", threads=2)


def test_bf16_on_a_card_without_it_is_refused(two_fake_gpus):
    with pytest.raises(EngineError, match="no bf16 support"):
        devices.plan("cuda", "bf16", threads=2)


def test_no_memory_cap_unless_asked(two_fake_gpus):
    devices.plan("cuda", "fp32", threads=2)

    assert "fraction" not in two_fake_gpus


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"dtype": "fp64"}, "DTYPE"),
        ({"gpu_memory_fraction": 1.5}, "GPU_MEMORY_FRACTION"),
        ({"engine": "tensorrt"}, "ENGINE"),
    ],
)
def test_invalid_engine_settings_name_the_variable(overrides, variable):
    with pytest.raises(ConfigError, match=variable):
        load_settings(**overrides)


def test_onnx_engine_refuses_torch_only_settings():
    from predictor.engine import factory as engines

    with pytest.raises(EngineError, match="ENGINE=torch only"):
        engines.create(load_settings(engine="onnx", dtype="bf16"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU machine)")
def test_cuda_engine_matches_cpu(voice_dir, engines):
    cuda_engine = TorchEngine(device="cuda", dtype="fp32", threads=2, gpu_memory_fraction=0.5, compile=False)
    cuda_engine.load(voice_dir)

    a = cuda_engine.synthesize(TEXTS, QUIET)
    b = engines[0].synthesize(TEXTS, QUIET)

    for x, y in zip(a, b, strict=False):
        assert x.shape == y.shape and np.abs(x - y).max() <= 1e-3


# --- COMPILE=1 ----------------------------------------------------------------------------------
# One compiled engine for the module: torch.compile of the decoder on CPU takes about two minutes on a
# cold inductor cache here (seconds once /tmp/torchinductor_* holds it), so it is built once.
@pytest.fixture(scope="module")
def compiled(voice_dir):
    from torch._dynamo.utils import counters

    from predictor.engine.factory import create

    settings = load_settings(compile=True, cpu_threads=1)
    engine = create(settings)
    engine.load(voice_dir)
    engine.warmup(settings.warmup_text)
    return engine, counters["stats"]


@pytest.mark.slow
def test_compile_1_serves_the_eager_engines_audio(compiled, reference):
    engine, _ = compiled
    text = "Compiled speech sounds the same."

    (audio,) = engine.synthesize([text], SynthesisParams(noise_scale=0.0, noise_w=0.0))

    assert isinstance(engine._model.dec, torch._dynamo.eval_frame.OptimizedModule)
    check_samples(audio, reference.speak(text))


@pytest.mark.slow
def test_compile_1_compiles_nothing_on_a_short_request(compiled):
    engine, stats = compiled
    graphs = stats["unique_graphs"]

    engine.synthesize(["Hi."], SynthesisParams(noise_scale=0.0, noise_w=0.0))  # ~40 frames

    assert stats["unique_graphs"] == graphs


def test_an_encoder_published_before_its_noise_input_and_durations_output_is_rewritten_at_load(
    engines, voice_dir, tmp_path
):
    from predictor.engine.voice_files import DURATIONS_NAME, NOISE_NAME

    _, onnx_engine = engines
    old = as_published_before_noise_and_durations(voice_dir, tmp_path / "old-voice")
    session = onnxruntime.InferenceSession(str(old / "encoder.onnx"), providers=["CPUExecutionProvider"])
    assert NOISE_NAME not in [i.name for i in session.get_inputs()]
    assert DURATIONS_NAME not in [o.name for o in session.get_outputs()]

    loaded = OnnxEngine(device="cpu", threads=2)
    loaded.load(old)
    seeded = SynthesisParams(seed=11)

    np.testing.assert_array_equal(
        loaded.synthesize(TEXTS[1:2], seeded)[0], onnx_engine.synthesize(TEXTS[1:2], seeded)[0]
    )
    assert (
        loaded.align_checked(TEXTS[1:2], seeded)[0][1] == onnx_engine.align_checked(TEXTS[1:2], seeded)[0][1]
    )


@pytest.mark.parametrize("engine", ["torch", "onnx"])
def test_the_models_durations_add_up_to_its_audio_and_every_written_word_is_timed_once_in_order(
    engines, engine
):
    torch_engine, onnx_engine = engines
    chosen = torch_engine if engine == "torch" else onnx_engine
    text = TEXTS[2] + " " + TEXTS[1]  # numbers, abbreviations, several sentences

    ((audio, sentences),) = chosen.spoken([text], SynthesisParams(seed=3))
    ((audio_again, words),) = chosen.align_checked([text], SynthesisParams(seed=3))

    assert sum(int(s.frames.sum()) for s in sentences) * chosen.hop_length == len(audio)  # to the sample
    np.testing.assert_array_equal(audio_again, audio)
    assert [w.word for w in words] == text.split()
    assert all(0 <= w.start <= w.end <= len(audio) for w in words)
    assert all(a.end <= b.start for a, b in itertools.pairwise(words))
    spoken = [w for w in words if w.end > w.start]
    assert len(spoken) == len(words)  # every word of these texts is spoken, none a point


def test_seeded_word_times_agree_between_the_engines(engines):
    torch_engine, onnx_engine = engines

    ((_, ours),) = torch_engine.align_checked(TEXTS[1:2], SynthesisParams(seed=5))
    ((_, theirs),) = onnx_engine.align_checked(TEXTS[1:2], SynthesisParams(seed=5))

    assert ours == theirs


def test_the_published_decoder_gives_the_voices_own_decoders_audio(voice_dir):
    """decoder_head.onnx then decoder_tail.onnx as publish writes them (upsamplings as convolutions,
    every convolution 2-D), against Piper's graph cut at the generator, untouched; run as the engine
    runs them on CPU (onnxruntime's blocked layout) and unoptimized."""
    import onnx

    from predictor.engine.voice_files import DECODER_HEAD_ONNX, DECODER_TAIL_ONNX, LATENT_NAME, UPSAMPLED_NAME

    untouched = untouched_decoder(voice_dir / "model.onnx")
    head = onnx.load(str(voice_dir / DECODER_HEAD_ONNX))
    tail = onnx.load(str(voice_dir / DECODER_TAIL_ONNX))
    assert "ConvTranspose" in {n.op_type for n in untouched.graph.node}
    published = [*head.graph.node, *tail.graph.node]
    assert "ConvTranspose" not in {n.op_type for n in published}
    kernels = [
        a.ints for n in published if n.op_type == "Conv" for a in n.attribute if a.name == "kernel_shape"
    ]
    assert len(kernels) == 8 + 15 and all(len(k) == 2 and k[0] == 1 for k in kernels)
    latent = np.random.default_rng(3).standard_normal((1, 192, 90)).astype(np.float32)

    def run(
        model: onnx.ModelProto, feed: dict[str, np.ndarray], level=GraphOptimizationLevel.ORT_ENABLE_ALL
    ) -> np.ndarray:
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = level
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
        return session.run(None, feed)[0]

    expected = run(untouched, {LATENT_NAME: latent}, GraphOptimizationLevel.ORT_DISABLE_ALL)
    for level in (GraphOptimizationLevel.ORT_ENABLE_ALL, GraphOptimizationLevel.ORT_DISABLE_ALL):
        upsampled = run(head, {LATENT_NAME: latent}, level)
        got = run(tail, {UPSAMPLED_NAME: upsampled}, level)
        # upsample_initial_channel / 2 at upsample_rates[0] per frame
        assert upsampled.shape == (1, 128, 90 * 8)
        assert got.shape == expected.shape == (1, 1, 1, 90 * 256)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_the_published_priors_attention_over_its_window_gives_the_exported_attentions_outputs_exactly(
    voice_dir,
):
    """prior.onnx as publish writes it (banded_attention) against the encoder's attention as Piper
    exported it, for phoneme counts below, at and past the window (2w + 1 = 9) and a long sentence's."""
    import onnx

    from predictor.engine.exported_graph import banded_attention
    from predictor.engine.voice_files import PRIOR_ONNX

    published = onnx.load(str(voice_dir / PRIOR_ONNX))
    exported = prior_before_banded_attention(voice_dir / "model.onnx")
    layers = [
        n.name for n in exported.graph.node if n.name.endswith("/MatMul_1") and "/attn_layers." in n.name
    ]
    assert len(layers) == 6  # the [T, 2T - 1] products of queries and padded key embeddings, one a layer
    assert not any(n.name in layers for n in published.graph.node)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3

    def session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
        return onnxruntime.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )

    ours, theirs = session(published), session(exported)
    rng = np.random.default_rng(7)
    for t in [*range(1, 12), 64, 750]:
        feeds = {
            "input": rng.integers(1, 100, (1, t), dtype=np.int64),
            "input_lengths": np.asarray([t], dtype=np.int64),
            "scales": np.asarray([0.667, 1.0, 0.8], dtype=np.float32),
            "noise": rng.standard_normal(2 * t + 192 * 40 * t, dtype=np.float32),
        }
        for got, expected in zip(ours.run(None, feeds), theirs.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, expected)
    again = onnx.load(str(voice_dir / PRIOR_ONNX))
    assert banded_attention(again).SerializeToString() == published.SerializeToString()  # idempotent


def test_the_decoder_tail_in_chunks_gives_its_whole_runs_audio_and_needs_all_of_its_context(engines):
    _, onnx_engine = engines
    from predictor.engine.voice_files import LATENT_NAME, UPSAMPLED_NAME

    latent = np.random.default_rng(5).standard_normal((1, 192, 300)).astype(np.float32)
    upsampled = onnx_engine._decoder.run(None, {LATENT_NAME: latent})[0]
    whole = onnx_engine._tail.run(None, {UPSAMPLED_NAME: upsampled})[0].reshape(-1)
    assert round(upsampled.shape[-1] / onnx_engine._tail_chunk) >= 4  # 300 frames: several chunks

    np.testing.assert_allclose(onnx_engine._run_tail(upsampled), whole, rtol=0, atol=1e-6)
    np.testing.assert_allclose(onnx_engine._decode(latent), np.clip(whole, -1, 1), rtol=0, atol=1e-6)
    context = onnx_engine._tail_context
    try:
        onnx_engine._tail_context = context // 2
        assert np.abs(onnx_engine._run_tail(upsampled) - whole).max() > 1e-4
    finally:
        onnx_engine._tail_context = context


def test_a_voice_published_with_one_decoder_file_runs_it_whole_for_the_same_audio(
    engines, voice_dir, tmp_path
):
    _, onnx_engine = engines
    old = as_published_before_the_decoder_cut(voice_dir, tmp_path / "old-voice")
    loaded = OnnxEngine(device="cpu", threads=2)
    loaded.load(old)
    seeded = SynthesisParams(seed=4)

    assert loaded._tail is None and onnx_engine._tail is not None
    np.testing.assert_allclose(
        loaded.synthesize(TEXTS[1:2], seeded)[0],
        onnx_engine.synthesize(TEXTS[1:2], seeded)[0],
        rtol=0,
        atol=1e-5,
    )


def test_a_voice_published_with_one_flow_file_runs_it_whole_for_the_same_audio(engines, voice_dir, tmp_path):
    _, onnx_engine = engines
    old = as_published_before_the_coupling_cut(voice_dir, tmp_path / "old-voice")
    loaded = OnnxEngine(device="cpu", threads=2)
    loaded.load(old)
    seeded = SynthesisParams(seed=4)

    # One flow.onnx reads the whole flow's context around a stream's piece (33 frames), the coupling
    # layers their own 8 each.
    assert (len(loaded._flows), loaded._flow_contexts) == (1, [33])
    assert (len(onnx_engine._flows), onnx_engine._flow_contexts) == (4, [8, 8, 8, 8])
    whole = onnx_engine.synthesize(TEXTS[1:2], seeded)[0]
    np.testing.assert_array_equal(loaded.synthesize(TEXTS[1:2], seeded)[0], whole)
    streamed = np.concatenate([a for a, _ in loaded.stream(TEXTS[1], seeded, StreamWindows(24, 192))])
    assert np.abs(streamed - whole).max() <= 1e-4


def test_the_flows_coupling_layers_share_one_arena(engines):
    # Four sessions, one after the other: an arena each would keep four peaks where one flow.onnx kept
    # one (resident memory 545 -> 686 MiB after requests of every length; docs/benchmarks.md).
    _, onnx_engine = engines
    assert len(onnx_engine._flows) == 4
    for session in onnx_engine._flows:
        options = session.get_session_options()
        assert options.get_session_config_entry("session.use_env_allocators") == "1"
    # The prior keeps its own (the setting absent).
    assert onnx_engine._prior is not None
    with pytest.raises(RuntimeError, match="use_env_allocators"):
        onnx_engine._prior.get_session_options().get_session_config_entry("session.use_env_allocators")


# --- lanes: a call's sentences side by side (engine/lanes.py) ---------------------------------------
@pytest.fixture(scope="module")
def laned(voice_dir):
    """A two-thread engine running its calls on the lanes of a one-thread copy, as the server sets it up."""
    engine, copy = OnnxEngine(device="cpu", threads=2), OnnxEngine(device="cpu", threads=1)
    engine.load(voice_dir)
    copy.load(voice_dir)
    assert engine.lane_threads() == 1 and engine.add_lanes(copy)
    return engine, copy


LONG = (
    "When the first request of the morning arrives at a service that has been scaled to zero overnight, "
    "the platform has to start a container, fetch the voice from object storage and warm it up."
)


def test_a_call_on_lanes_gives_each_sentence_the_audio_and_durations_of_one_at_a_time(engines, laned):
    _, alone = engines
    engine, _ = laned
    seeded = SynthesisParams(seed=31)
    texts = [*TEXTS, LONG]  # several sentences per text, and one long enough for its tail's chunks to spread

    on_lanes = engine.spoken(texts, seeded)
    one_at_a_time = alone.spoken(texts, seeded)

    for (audio, sentences), (expected, expected_sentences) in zip(on_lanes, one_at_a_time, strict=True):
        assert [s.frames.tolist() for s in sentences] == [s.frames.tolist() for s in expected_sentences]
        # One thread sums the same graph in another order than two.
        np.testing.assert_allclose(audio, expected, rtol=0, atol=1e-4)
    # The same call runs on the same copies whatever the lanes' timing: the same samples again.
    for (audio, _), (again, _) in zip(on_lanes, engine.spoken(texts, seeded), strict=True):
        np.testing.assert_array_equal(again, audio)


def test_lanes_run_a_calls_sentences_at_the_same_time_on_the_one_thread_copy(laned, monkeypatch):
    import threading
    import time

    engine, copy = laned
    spans: list[tuple[int, float, float]] = []
    tail_piece = copy._tail_piece

    def timed(*args):
        start = time.perf_counter()
        tail_piece(*args)
        spans.append((threading.get_ident(), start, time.perf_counter()))

    monkeypatch.setattr(copy, "_tail_piece", timed)
    engine.synthesize([*TEXTS[1:2], LONG], SynthesisParams(seed=3))

    assert len({thread for thread, _, _ in spans}) == 2
    overlapping = sum(
        1
        for (t1, s1, e1), (t2, s2, e2) in itertools.combinations(spans, 2)
        if t1 != t2 and s1 < e2 and s2 < e1
    )
    assert overlapping >= len(spans) // 2, spans


@pytest.mark.parametrize("text", [LONG, "Hi there.", "It was a bright cold day in April."], ids=len)
def test_a_lone_sentences_tail_runs_on_the_lanes_in_as_many_chunks_for_each_lane(
    engines, laned, monkeypatch, text
):
    _, alone = engines
    engine, copy = laned
    seeded = SynthesisParams(seed=8)
    ran: list[str] = []
    for name, e in (("two threads", engine), ("one thread", copy)):
        monkeypatch.setattr(
            e, "_tail_piece", lambda *args, e=e, name=name, f=e._tail_piece: (ran.append(name), f(*args))[1]
        )

    audio = engine.synthesize([text], seeded)[0]
    # Never a lane left alone with the last chunk: an even count, short sentences too (two at least).
    assert set(ran) == {"one thread"} and len(ran) >= 2 and len(ran) % 2 == 0
    np.testing.assert_allclose(audio, alone.synthesize([text], seeded)[0], rtol=0, atol=1e-4)


def test_a_failing_sentence_fails_the_call_on_lanes_and_the_next_call_runs(laned, monkeypatch):
    engine, copy = laned
    encode = copy._encode
    calls = iter(range(100))

    def second_fails(*args):
        if next(calls) == 1:
            raise EngineError("the second sentence's encoder failed")
        return encode(*args)

    monkeypatch.setattr(copy, "_encode", second_fails)
    with pytest.raises(EngineError, match="second sentence"):
        engine.synthesize(["One. Two. Three."], SynthesisParams(seed=1))
    monkeypatch.setattr(copy, "_encode", encode)

    assert len(engine.synthesize(["One. Two. Three."], SynthesisParams(seed=1))[0]) > 0


# Streams of several sentences on an engine with lanes, each window's tail spread over them: a long
# first sentence, a short one, and short ones only.
STREAMED = [
    LONG + " It answers. Then it sleeps again until the next morning comes around.",
    "Hi. " + LONG,
    "The first sentence sets the scene. The second one adds a detail or two. And the third closes it.",
]


@pytest.mark.parametrize(("first", "size"), [(24, 192), (3, 40), (24, 10_000), (192, 192)])
def test_a_stream_on_lanes_joins_into_the_whole_answer(laned, first, size):
    engine, _ = laned
    for n, text in enumerate(STREAMED):
        seeded = SynthesisParams(seed=60 + n)
        pieces = list(engine.stream(text, seeded, StreamWindows(first, size)))

        whole = engine.synthesize([text], seeded)[0]
        joined = np.concatenate([audio for audio, _ in pieces])
        assert joined.shape == whole.shape, text
        # A stream's text encoders and flows ran on two threads, the whole answer's on one (lanes).
        np.testing.assert_allclose(joined, whole, rtol=0, atol=1e-4, err_msg=text)
        assert [last for _, last in pieces] == [False] * (len(pieces) - 1) + [True]
