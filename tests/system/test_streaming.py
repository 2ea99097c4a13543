"""Chunked vocoder streaming: window-joined audio equals the whole decode on both engines, and the
three streaming transports (raw speech stream, OpenAI SSE, Triton ModelStreamInfer) deliver audio
before the end of a single long sentence."""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import json
import math
import queue
import threading
import time
from functools import partial

import httpx
import numpy as np
import pytest
import soundfile
import torch
import tritonclient.grpc as triton_grpc

from predictor.config import ConfigError, load_settings
from predictor.engine import phonemes, windows
from predictor.engine.base import StreamWindows, SynthesisParams
from predictor.engine.exported import OnnxEngine
from predictor.engine.native import TorchEngine
from predictor.engine.vits import VitsConfig
from predictor.serving import pipeline
from predictor.serving.batcher import Batcher
from predictor.serving.service import TTSService

SENTENCES = [
    "Hi.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming starts speaking long before the sentence is finished, which is what a listener notices.",
    "Numbers like 1,234 and dates such as March 3rd, 2021 are read out in full; so are abbreviations.",
    "A much longer sentence, with several clauses, commas, and a rhythm of its own, keeps going and going "
    "so that the decoder has many windows to cover before it reaches the very end of it.",
]
# (first window, later windows) in frames: single frames, tiny, the defaults, one window for all.
WINDOW_SIZES = [(1, 8), (3, 40), (24, 192), (24, 10_000)]
# ~30 words in one sentence: about 8 s of audio, several windows with the default sizes.
LONG_SENTENCE = (
    "When the evening train finally pulled into the quiet station at the edge of the valley, the "
    "travellers gathered their bags and stepped out into the cold air that smelled of pine and rain."
)


@pytest.fixture(scope="module")
def torch_engine(voice_dir):
    engine = TorchEngine(device="cpu", dtype="fp32", threads=1, gpu_memory_fraction=0.0, compile=False)
    engine.load(voice_dir)
    return engine


@pytest.fixture(scope="module")
def onnx_engine(voice_dir):
    engine = OnnxEngine(device="cpu", threads=1)
    engine.load(voice_dir)
    return engine


def _joined(engine, text: str, params: SynthesisParams, first: int, size: int) -> tuple[np.ndarray, list]:
    pieces = list(engine.stream(text, params, StreamWindows(first, size)))
    return np.concatenate([audio for audio, _ in pieces]), [last for _, last in pieces]


@pytest.mark.parametrize(("first", "size"), WINDOW_SIZES)
def test_torch_windows_join_into_the_whole_decode(torch_engine, first, size):
    for k, sentence in enumerate(SENTENCES):
        seeded = SynthesisParams(seed=100 + k)  # same noise for the whole and the windowed synthesis
        whole = torch_engine.synthesize([sentence], seeded)[0]

        joined, lasts = _joined(torch_engine, sentence, seeded, first, size)

        assert joined.shape == whole.shape, sentence
        assert np.abs(joined - whole).max() <= 1e-4, sentence
        assert lasts == [False] * (len(lasts) - 1) + [True]


@pytest.mark.parametrize(("first", "size"), WINDOW_SIZES)
def test_onnx_windows_join_into_the_whole_decode(onnx_engine, first, size):
    quiet = SynthesisParams(noise_scale=0.0, noise_w=0.0)  # the graph draws its own noise: none here
    for sentence in SENTENCES:
        whole = onnx_engine.synthesize([sentence], quiet)[0]

        joined, lasts = _joined(onnx_engine, sentence, quiet, first, size)

        assert joined.shape == whole.shape, sentence
        assert np.abs(joined - whole).max() <= 1e-4, sentence
        assert lasts[-1] and not any(lasts[:-1])


def test_context_shorter_than_the_receptive_field_breaks_the_join(torch_engine):
    model = torch_engine._model
    voice = torch_engine.voice
    ids = next(iter(phonemes.sentence_ids(SENTENCES[4], voice.espeak_voice, voice.phoneme_id_map)))
    z, _, _ = model.latent(torch.tensor([ids]), torch.tensor([len(ids)]), 0.667, 1.0, 0.8)
    whole = model.decode(z)[0]
    hop = model.config.hop_length

    def joined(context: int) -> torch.Tensor:
        plan = windows.plan(z.size(-1), 5, 20, context)
        return torch.cat(
            [model.decode(z[:, :, w.context_start : w.context_end])[0, w.keep(hop)] for w in plan]
        )

    context = windows.decoder_context_frames(model.config)
    assert float((joined(context) - whole).abs().max()) <= 1e-4
    assert float((joined(context - 5) - whole).abs().max()) > 1e-4


def _flowed_in_pieces(engine, prior: np.ndarray, first_end: int, contexts: list[int]) -> np.ndarray:
    """The latent of ``prior`` made as a stream makes it: the flow's stages over windows.flow_runs."""
    stages = [prior, *(np.empty_like(prior) for _ in contexts)]
    for piece in windows.flow_runs(prior.shape[-1], first_end, contexts):
        engine._flow_piece(stages, piece)
    return stages[-1]


def test_a_flow_context_shorter_than_its_receptive_field_breaks_the_join(onnx_engine):
    voice = onnx_engine.voice
    ids = next(iter(phonemes.sentence_ids(SENTENCES[4], voice.espeak_voice, voice.phoneme_id_map)))
    prior, mask, _ = onnx_engine._encode(ids, onnx_engine._scales(SynthesisParams()), None, seed=7)
    whole = onnx_engine._run_flow(prior, mask)
    contexts = onnx_engine._flow_contexts  # windows.coupling_context_frames of the voice, per layer
    assert len(windows.flow_runs(prior.shape[-1], 30, contexts)) == 2

    assert np.abs(_flowed_in_pieces(onnx_engine, prior, 30, contexts) - whole).max() <= 1e-4
    # Each coupling layer reads 8 frames around; 6 leave its far taps out and move the join.
    narrower = [c - 2 for c in contexts]
    assert np.abs(_flowed_in_pieces(onnx_engine, prior, 30, narrower) - whole).max() > 1e-4


def test_an_onnx_streams_window_runs_the_tail_only_over_its_own_positions_and_the_tails_context(
    onnx_engine, monkeypatch
):
    read: list[int] = []
    tail_piece = onnx_engine._tail_piece

    def recording(upsampled, start, end, audio, origin=0):
        read.append(min(upsampled.shape[-1], end + context) - max(0, start - context))
        tail_piece(upsampled, start, end, audio, origin)

    context, u = onnx_engine._tail_context, onnx_engine._upsample
    monkeypatch.setattr(onnx_engine, "_tail_piece", recording)
    stream = onnx_engine.stream(LONG_SENTENCE, SynthesisParams(seed=1), StreamWindows(24, 192))

    next(stream)
    # The first window's 24 frames and the tail's context on its right, where the head ran over the
    # window and 13 frames more (decoder_head_context): 203 positions, not (24 + 13) x 8 = 296.
    assert read == [24 * u + context]
    stream.close()


def test_a_head_context_shorter_than_its_reach_breaks_the_join(onnx_engine, monkeypatch):
    seeded = SynthesisParams(seed=4)
    whole = onnx_engine.synthesize([LONG_SENTENCE], seeded)[0]
    assert np.abs(_joined(onnx_engine, LONG_SENTENCE, seeded, 24, 40)[0] - whole).max() <= 1e-4

    monkeypatch.setattr(onnx_engine, "_head_context", onnx_engine._head_context - 4)

    assert np.abs(_joined(onnx_engine, LONG_SENTENCE, seeded, 24, 40)[0] - whole).max() > 1e-4


def test_an_onnx_stream_runs_each_coupling_layer_only_over_its_first_windows_share_before_the_first_audio(
    onnx_engine, monkeypatch
):
    ran: list[tuple[int, int]] = []  # (stage, frames read)
    real = onnx_engine._run_stage
    monkeypatch.setattr(
        onnx_engine, "_run_stage", lambda i, x, mask=None: ran.append((i, x.shape[-1])) or real(i, x, mask)
    )
    stream = onnx_engine.stream(LONG_SENTENCE, SynthesisParams(seed=1), StreamWindows(24, 192))

    first, _ = next(stream)
    before_first_audio = list(ran)
    frames = (len(first) + sum(len(audio) for audio, _ in stream)) // onnx_engine.hop_length

    # The first window's 24 frames and the head's 13 more from the last coupling layer, each layer
    # before it 8 frames further (its own context), not every layer over the whole flow's 33.
    reach, (context, *_) = 24 + onnx_engine._head_context, onnx_engine._flow_contexts
    assert before_first_audio == [(i, reach + (4 - i) * context) for i in range(4)]
    # After the first audio each layer once more, over the rest and its context on the left: each
    # layer's two runs read its frames and twice its context, no more.
    assert [i for i, _ in ran[4:]] == [0, 1, 2, 3]
    assert [ran[i][1] + ran[4 + i][1] for i in range(4)] == [frames + 2 * context] * 4


@pytest.mark.parametrize("engine_name", ["onnx", "torch"])
def test_only_a_streams_first_sentence_starts_with_a_short_window(onnx_engine, torch_engine, engine_name):
    engine = {"onnx": onnx_engine, "torch": torch_engine}[engine_name]
    text = "The first sentence is short. The second one is short too."
    seeded = SynthesisParams(seed=5)
    hop = engine.hop_length

    pieces = [audio for audio, _ in engine.stream(text, seeded, StreamWindows(24, 192))]

    whole = engine.synthesize([text], seeded)[0]
    joined = np.concatenate(pieces)
    assert joined.shape == whole.shape and np.abs(joined - whole).max() <= 1e-4
    first_sentence = engine.synthesize(["The first sentence is short."], seeded)[0]
    assert len(pieces[0]) == 24 * hop
    # The first sentence (under 192 frames) in two windows, then the second in one: 192 frames or
    # fewer, since it starts while the first plays.
    assert sum(len(p) for p in pieces[:2]) == len(first_sentence)
    assert len(pieces) == 3 and len(pieces[2]) == len(whole) - len(first_sentence) <= 192 * hop


def test_a_streams_later_segments_start_with_a_whole_window(onnx_engine, monkeypatch):
    # On one CPU thread the speech route streams a request segment by segment (serving/pipeline.windows);
    # a later segment starts while the earlier audio plays, so only the first segment's first window
    # is short (before, every segment paid the short window and the flow's split, 8-15 % of a stream).
    settings = load_settings(max_segment_chars=40, cpu_threads=1)  # one sentence a segment here
    service = TTSService(settings)
    service.mark_ready(onnx_engine)
    firsts: list[int] = []
    stream_checked = onnx_engine.stream_checked

    def recording(text, params, sizes):
        firsts.append(sizes.first_of(0))
        return stream_checked(text, params, sizes)

    monkeypatch.setattr(onnx_engine, "stream_checked", recording)
    text = "The first sentence is short. The second one is short too. And a third one."
    pieces = pipeline.prepare(text, SynthesisParams(seed=5), 40, service.sample_rate, markup=False)

    async def stream() -> list[np.ndarray]:
        return [audio async for audio in pipeline.windows(service, pieces, settings.crossfade_ms)]

    audio = asyncio.run(stream())

    assert len(pieces) == 3 and sum(len(a) for a in audio) > 0
    assert firsts == [24, 192, 192]


def test_on_two_threads_a_streams_later_segments_go_in_calls_no_larger_than_four_times_what_it_sent(
    voice_dir, onnx_engine, monkeypatch
):
    # Where the engine runs a call's sentences side by side (engine/lanes.py), the first segment still
    # streams window by window and the later ones go to it a few at a time, each call at most four
    # times the characters already sent (serving/pipeline.STREAM_GROUP_CHARS_PER_SENT).
    settings = load_settings(max_segment_chars=40, cpu_threads=2)
    engine = OnnxEngine(device="cpu", threads=2)
    engine.load(voice_dir)
    assert engine.add_lanes(onnx_engine)
    service = TTSService(settings)
    service.mark_ready(engine)
    calls: list[list[str]] = []
    streamed: list[str] = []
    spoken, stream_checked = engine.spoken, engine.stream_checked
    monkeypatch.setattr(
        engine, "spoken", lambda texts, params: (calls.append(list(texts)), spoken(texts, params))[1]
    )
    monkeypatch.setattr(
        engine,
        "stream_checked",
        lambda text, params, sizes: (streamed.append(text), stream_checked(text, params, sizes))[1],
    )
    text = "It starts. The second one is short. A third follows it. Then a fourth. And a fifth ends it."
    seeded = SynthesisParams(seed=5)
    pieces = pipeline.prepare(text, seeded, 40, service.sample_rate, markup=False)

    async def both() -> tuple[list[np.ndarray], np.ndarray]:
        stream = [audio async for audio in pipeline.windows(service, pieces, settings.crossfade_ms)]
        whole = await pipeline.synthesize_prepared(service, [pieces], settings.crossfade_ms)
        return stream, whole.audio[0]

    stream, whole = asyncio.run(both())

    assert streamed == ["It starts."]  # 10 characters sent: the next call may carry 40
    assert calls[:2] == [
        ["The second one is short."],
        ["A third follows it.", "Then a fourth.", "And a fifth ends it."],
    ]
    assert calls[2:] == [[p.text for p in pieces[:4]], [pieces[4].text]]  # the whole answer: four, then one
    joined = np.concatenate(stream)
    # The first segment's windows join into its whole decode within 1e-4 (test_onnx_windows_join_...).
    assert len(joined) == len(whole) and np.abs(joined - whole).max() <= 1e-4


def test_receptive_field_follows_the_voice_config(voice_dir):
    config = VitsConfig.from_dict(json.loads((voice_dir / "vits.json").read_text()))
    wider = VitsConfig.from_dict(
        {
            **config.to_dict(),
            "resblock_dilation_sizes": [[d * 4 for d in ds] for ds in config.resblock_dilation_sizes],
        }
    )

    assert 8 <= windows.decoder_context_frames(config) <= 20
    assert windows.decoder_context_frames(wider) > windows.decoder_context_frames(config)
    # After the first stage, in its output's positions: ups.1 (k=16, u=8) 2, its widest resblock chain
    # (k=7, dilations 3 and 12: 45 samples) 45/8, ups.2 (k=8, u=4) 2/8, its chain 45/32, conv_post 3/32.
    assert windows.decoder_tail_context(config) == math.ceil(2 + 45 / 8 + 2 / 8 + 45 / 32 + 3 / 32) + 1 == 11
    assert windows.decoder_tail_context(wider) > windows.decoder_tail_context(config)
    # The head's reach for the tail's window: conv_pre 3, ups.0 (k=16, u=8) 2, its widest chain 45/8,
    # and the tail's own context (11 positions) at 8 per frame.
    assert windows.decoder_head_context(config) == math.ceil(3 + 2 + 45 / 8 + 11 / 8) + 1 == 13
    assert windows.decoder_head_context(wider) > windows.decoder_head_context(config)
    assert windows.coupling_context_frames(config) == 2 + 2 + 2 + 2  # 4 k=5 convs in each coupling layer
    assert windows.flow_context_frames(config) == 4 * 8 + 1  # 4 coupling layers, one frame more
    deeper = VitsConfig.from_dict({**config.to_dict(), "flow_dilation_rate": 2})
    assert windows.coupling_context_frames(deeper) == 2 + 4 + 8 + 16
    assert windows.flow_context_frames(deeper) == 4 * (2 + 4 + 8 + 16) + 1


def test_window_plan_covers_every_frame_once():
    for n in range(1, 400, 7):
        plan = windows.plan(n, 24, 50, 13)
        assert plan[0].start == 0 and plan[-1].end == n
        assert all(a.end == b.start for a, b in itertools.pairwise(plan))
        assert plan[0].end - plan[0].start == min(24, n)  # the first window is never merged away
        assert all(0 <= w.context_start <= w.start < w.end <= w.context_end <= n for w in plan)


def test_later_windows_double_so_a_long_sentence_pays_the_context_a_few_times():
    # About 23 s of audio in four windows where 192 each took eleven: 24, 192, 384, then the 768
    # due next with the rest (632 frames, under half of the 1,536 after it) joined to it.
    assert [w.end - w.start for w in windows.plan(2000, 24, 192, 13)] == [24, 192, 384, 1400]
    # A remainder of at least half the window it would be stands alone.
    assert [w.end - w.start for w in windows.plan(1000, 24, 192, 13)] == [24, 192, 384, 400]
    assert [w.end - w.start for w in windows.plan(700, 24, 192, 13)] == [24, 192, 484]


def test_a_later_sentence_under_two_windows_is_decoded_whole_and_a_first_one_is_not():
    # A later sentence's first window sets no first audio, so a remainder under half the next
    # window (384 frames) may join it; the first sentence's short window is never merged away.
    assert [(w.start, w.end) for w in windows.plan(380, 192, 192, 13)] == [(0, 380)]
    assert [(w.start, w.end) for w in windows.plan(400, 192, 192, 13)] == [(0, 192), (192, 400)]
    assert [(w.start, w.end) for w in windows.plan(40, 24, 192, 13)] == [(0, 24), (24, 40)]


@pytest.mark.parametrize("contexts", [[8, 8, 8, 8], [33], [2, 30, 5]])
def test_flow_runs_make_every_frame_of_every_stage_once_from_frames_already_made(contexts):
    for n in range(1, 400, 7):
        made = [n] + [0] * len(contexts)  # the prior, then each stage's output: frames made so far
        pieces = windows.flow_runs(n, 37, contexts)
        for piece in pieces:
            for i, run in piece:
                assert run.start == made[i + 1] < run.end  # the next frames, never again
                assert run.context_start == max(0, run.start - contexts[i])
                assert run.context_end == min(n, run.end + contexts[i]) <= made[i]  # read what is made
                made[i + 1] = run.end
            assert piece[-1][0] == len(contexts) - 1  # each piece brings the latent on
        assert made == [n] * (len(contexts) + 1)
        # Cut only where the rest is at least three times the contexts the cut redoes; then the
        # first piece makes exactly the latent's first 37 frames.
        assert len(pieces) == (2 if n - 37 >= 3 * sum(contexts) else 1)
        assert len(pieces) == 1 or pieces[0][-1][1].end == 37


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"stream_first_window_frames": 0}, "STREAM_FIRST_WINDOW_FRAMES"),
        ({"stream_window_frames": 4}, "STREAM_WINDOW_FRAMES"),
        ({"stream_first_window_frames": 100, "stream_window_frames": 50}, "STREAM_WINDOW_FRAMES"),
        ({"voice_aliases": "not json"}, "VOICE_ALIASES"),
    ],
)
def test_window_sizes_out_of_range_are_config_errors_naming_the_variable(env, variable, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name.upper(), str(value))

    with pytest.raises(ConfigError, match=variable):
        load_settings()


def test_auto_engine_is_onnx_on_cpu_and_torch_when_torch_is_asked_for():
    assert load_settings().engine_name == "onnx"
    assert load_settings(dtype="bf16").engine_name == "torch"
    assert load_settings(compile=True).engine_name == "torch"
    assert load_settings(engine="torch").engine_name == "torch"


def test_a_stream_stops_at_the_next_window_when_its_caller_goes_away():
    decoded: list[int] = []
    release = threading.Event()

    def run_stream(text, params, following):
        for n in range(50):
            decoded.append(n)
            yield np.zeros(10, dtype=np.float32), n == 49
            release.wait(0.02)

    async def scenario() -> None:
        batcher = Batcher(
            lambda texts, params: [],
            run_stream=run_stream,
            max_batch_size=1,
            max_delay_s=0,
            max_queue=4,
            timeout_s=30,
        )
        got: asyncio.Queue = asyncio.Queue()
        future = batcher.submit(["text"], SynthesisParams(), on_piece=lambda a, last: got.put_nowait(last))
        await got.get()
        future.cancel()
        await asyncio.sleep(0.5)

    asyncio.run(scenario())
    assert len(decoded) < 5, f"the engine decoded {len(decoded)} windows after the caller left"


# --- over the wire --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def streaming_predictor(start_predictor):
    """ENGINE at its default, auto: onnx on CPU."""
    return start_predictor(ENGINE="auto")


def test_auto_engine_is_named_in_metadata_and_startup_log(streaming_predictor):
    meta = streaming_predictor.get("/v2/models/tts").json()

    assert meta["platform"] == "onnx"
    assert "onnx (ENGINE=auto" in streaming_predictor.logs()


def test_raw_speech_stream_delivers_its_first_chunk_before_the_last_window_is_decoded(streaming_predictor):
    # A chunk count alone cannot tell a stream from a whole body sent in pieces; arrival times can.
    # The engine starts on this request after it was sent and reports its own time for all windows
    # (tts_synthesis_seconds); a first chunk earlier than that cannot have waited for the last window.
    engine_before = streaming_predictor.metric("tts_synthesis_seconds_sum")
    count_before = streaming_predictor.metric("tts_synthesis_seconds_count")
    arrivals: list[float] = []
    chunks: list[bytes] = []
    sent = time.monotonic()
    with httpx.stream(
        "POST",
        streaming_predictor.url + "/v1/audio/speech",
        timeout=120,
        json={"model": "tts", "input": LONG_SENTENCE, "response_format": "pcm", "stream": True},
    ) as response:
        for chunk in response.iter_raw():
            if chunk:
                arrivals.append(time.monotonic() - sent)
                chunks.append(chunk)
    assert streaming_predictor.metric("tts_synthesis_seconds_count") == count_before + 1
    engine_s = streaming_predictor.metric("tts_synthesis_seconds_sum") - engine_before
    whole = streaming_predictor.post(
        "/v1/audio/speech", json={"model": "tts", "input": LONG_SENTENCE, "response_format": "pcm"}
    )

    assert response.status_code == 200
    assert len(chunks) > 1
    assert arrivals[0] < engine_s, f"first chunk after {arrivals[0]:.3f} s, all windows took {engine_s:.3f} s"
    assert arrivals[-1] - arrivals[0] > 0.2 * engine_s, f"chunks arrived at {arrivals}"
    # Same number of samples as the whole response (noise differs between two syntheses, length too:
    # durations are drawn, so compare only that both are a long sentence's worth).
    assert len(b"".join(chunks)) // 2 > 22050 * 4 and len(whole.content) // 2 > 22050 * 4


def test_openai_client_with_alloy_and_sse(streaming_predictor):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=streaming_predictor.url + "/v1", api_key="not-needed")

    reply = client.audio.speech.create(
        model="tts-1", voice="alloy", input="Hello, alloy.", response_format="wav"
    )
    audio, rate = soundfile.read(io.BytesIO(reply.content), dtype="float32")
    assert rate == 22050 and len(audio) > rate // 2

    events = []
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts",
        voice="alloy",
        input=LONG_SENTENCE,
        response_format="pcm",
        stream_format="sse",
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))

    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 1 and events[-1]["type"] == "speech.audio.done"
    assert all(e["type"] == "speech.audio.delta" for e in events[:-1])
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert len(pcm) // 2 > 22050 * 4


def _triton_stream(predictor, requests: list[tuple[str, list, dict]]) -> list:
    """Send (request id, inputs, async_stream_infer keywords) on one stream; collect (result, error)
    until each request has its final response or error."""
    results: queue.Queue = queue.Queue()
    client = triton_grpc.InferenceServerClient(predictor.grpc)
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    try:
        got = []
        for request_id, inputs, options in requests:
            client.async_stream_infer("tts", inputs, request_id=request_id, **options)
            while True:
                result, error = results.get(timeout=120)
                got.append((request_id, result, error))
                if error is not None:
                    break
                final = result.get_response().parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    break
        return got
    finally:
        client.stop_stream()
        client.close()


def _text_input(text: str, name: str = "text") -> list:
    inp = triton_grpc.InferInput(name, [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return [inp]


def test_triton_stream_sends_one_response_per_window_and_flags_the_last(streaming_predictor):
    got = _triton_stream(streaming_predictor, [("long-1", _text_input(LONG_SENTENCE), {})])

    assert all(error is None for _, _, error in got)
    assert len(got) > 1
    flags = [r.get_response().parameters["triton_final_response"].bool_param for _, r, _ in got]
    assert flags == [False] * (len(got) - 1) + [True]
    assert all(r.get_response().id == "long-1" for _, r, _ in got)
    for _, result, _ in got:
        audio, length = result.as_numpy("audio"), result.as_numpy("audio_length")
        assert audio.shape == (1, int(length[0])) and audio.dtype == np.float32
    assert sum(int(r.as_numpy("audio_length")[0]) for _, r, _ in got) > 22050 * 4


def test_triton_stream_answers_a_malformed_request_with_an_error_and_stays_open(streaming_predictor):
    got = _triton_stream(
        streaming_predictor,
        [
            ("bad", _text_input("Hello.", name="words"), {}),
            ("good", _text_input("Still here after the error."), {"enable_empty_final_response": True}),
        ],
    )

    bad = [(r, e) for rid, r, e in got if rid == "bad"]
    good = [r for rid, r, e in got if rid == "good"]
    assert len(bad) == 1 and bad[0][1] is not None and "text" in str(bad[0][1])
    assert all(e is None for rid, _, e in got if rid == "good")
    # With empty final responses asked for, the data responses say "not final" and an empty one ends.
    assert [r.get_response().parameters["triton_final_response"].bool_param for r in good][-1]
    assert len(good[-1].get_response().outputs) == 0
    assert sum(int(r.as_numpy("audio_length")[0]) for r in good[:-1]) > 22050


BAD_STREAMS = {
    "unknown stream_format": ({"stream_format": "chunks"}, "stream_format"),
    "unknown voice": ({"voice": "nonesuch"}, "alloy"),  # the message lists the accepted names
    "unknown model": ({"model": "tts-2"}, "tts-1-hd"),
    "stream as a string": ({"stream": "yes"}, "stream"),
    "unknown format with sse": ({"stream_format": "sse", "response_format": "aac"}, "aac"),
}


@pytest.mark.parametrize(("body", "reason"), BAD_STREAMS.values(), ids=BAD_STREAMS.keys())
def test_bad_stream_requests_get_400_naming_the_problem(streaming_predictor, body, reason):
    response = streaming_predictor.post("/v1/audio/speech", json={"model": "tts", "input": "Hi.", **body})

    assert response.status_code == 400, response.text
    assert reason in response.json()["error"]
