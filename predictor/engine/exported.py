"""Piper/VITS voices on onnxruntime: Piper's exported graph, in parts.

The artifact holds the graph split at publish (engine/exported_graph.split_onnx, split_flow and
split_couplings; file names in engine/voice_files): prior.onnx (text encoder, durations, the prior's
sample: phoneme ids -> z_p), the flow (z_p -> latent frames) as one file per coupling layer
(flow_0.onnx, ...), and the HiFi-GAN generator as decoder_head.onnx (conv_pre and the first
upsampling stage) and decoder_tail.onnx (the rest: -> audio). A whole synthesis runs them one after
the other, every node once, as the whole graph would, but on CPU the tail over chunks of
TAIL_CHUNK_FRAMES (below); a streamed one runs the flow in two pieces, each coupling layer over its
part and its own context (windows.flow_runs), and the decoder over frame windows (engine/windows.py),
so its first audio waits for the prior and only the first window's share of the flow and decoder: a
window's head over its frames and decoder_head_context more, its tail over its own positions and the
tail's context. An artifact without the parts (published before they existed) is split in memory at
load; one with prior.onnx, the flow in one flow.onnx or a whole decoder.onnx is run as it is.

Piper's export takes a padded batch but returns the padded tail as noise, and does not expose
per-item durations, so items are run one sentence at a time; the native torch engine batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from functools import cache, partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnxruntime

from predictor.engine import noise, phonemes, windows
from predictor.engine.base import Engine, PiperEngine, StreamWindows, SynthesisParams
from predictor.engine.lanes import Lanes, Task
from predictor.engine.voice_files import (
    CONFIG_FILE,
    DECODER_HEAD_ONNX,
    DECODER_ONNX,
    DECODER_TAIL_ONNX,
    DURATIONS_NAME,
    ENCODER_ONNX,
    FLOW_ONNX,
    LATENT_NAME,
    MASK_NAME,
    NOISE_NAME,
    PRIOR_NAME,
    PRIOR_ONNX,
    UPSAMPLED_NAME,
    flow_stage_files,
    read_config,
)
from predictor.engine.words import Sentence
from predictor.errors import EngineError

# Noise values fed per phoneme at first (engine/noise.py): the prior's channels times this many frames
# per phoneme at length_scale 1. Sentences of this voice average 3-6 frames a phoneme; one that needs
# more is run again with four times the feed (the same values, a longer prefix), so the bound costs
# drawing, never correctness.
FRAMES_PER_PHONEME = 8
# Frames of the decoder tail's input run at once on CPU (each with decoder_tail_context positions more
# on either side). The whole tail streams each activation ([32, 256 * F] floats at the last stage, 17 MB
# for a 99-character sentence's 527 frames) through memory between nodes; a 64-frame chunk's stay in
# the core's caches. One thread, two such decodes at once (two engine workers): 527 frames 331 -> 289
# ms, 200 frames 114 -> 111 ms; 32 to 96 frames did as well. Two threads: the same up to 600 frames,
# the 348-character sentence (1,300 frames) 803 -> 725 ms. A GPU runs the tail whole.
# docs/benchmarks.md, "The decoder's tail in chunks".
TAIL_CHUNK_FRAMES = 64


class _Parts(NamedTuple):
    """What a voice's graph is loaded from: file paths, or the serialized parts made at load."""

    prior: str | bytes
    flows: list[str | bytes]  # run one after the other
    coupled: bool  # flows are the coupling layers (else one flow.onnx, the whole flow)
    decoder: list[str | bytes]  # head and tail, or one decoder.onnx


class OnnxEngine(PiperEngine):
    name = "onnx"
    supports_seed = True

    def __init__(self, device: str, threads: int):
        if device.startswith("cuda"):
            if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                raise EngineError(
                    f"DEVICE={device} but this onnxruntime build has no CUDA provider "
                    f"(available: {', '.join(onnxruntime.get_available_providers())})"
                )
            index = int(device.split(":")[1]) if ":" in device else 0
            self._providers: list = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        else:
            self._providers = ["CPUExecutionProvider"]
        self._options = _session_options(device, threads, layout=False)
        self._layout_options = _session_options(device, threads, layout=True)
        # The flow's coupling layers run one after the other, each as its own session, and a session's
        # own CPU arena keeps the peak of its runs: four arenas where one flow.onnx had one, each as
        # large (resident memory after the same requests of every length 545 -> 686 MiB). They share
        # one arena in onnxruntime's environment instead (_shared_arena): 522 MiB, as fast as arenas of
        # their own; with no arena at all 518-541 MiB, but whole answers 2-4 % slower (docs/benchmarks.md,
        # "The flow one coupling layer at a time").
        self._flow_options = _session_options(device, threads, layout=False)
        if device == "cpu":
            _shared_arena()
            self._flow_options.add_session_config_entry("session.use_env_allocators", "1")
        self._prior: onnxruntime.InferenceSession | None = None
        self._flows: list[onnxruntime.InferenceSession] = []  # the coupling layers in order, or one flow.onnx
        self._decoder: onnxruntime.InferenceSession | None = None  # the head, or a whole decoder.onnx
        self._tail: onnxruntime.InferenceSession | None = None  # None: _decoder is the whole generator
        self._chunked = device == "cpu"
        self._threads = threads
        # Set by add_lanes: the lanes and the copy whose sessions they run.
        self._lanes: tuple[Lanes, OnnxEngine] | None = None
        # A feed too short for a sentence fails noise/1/Reshape, which _encode retries: not worth a log line.
        self._quiet_run = onnxruntime.RunOptions()
        self._quiet_run.log_severity_level = 4
        self._context = 0
        self._flow_contexts: list[int] = []  # frames on each side that each of _flows reads
        self._tail_context = 0  # positions of the tail's input on each side of a chunk
        self._tail_chunk = 0  # positions of the tail's input per chunk (TAIL_CHUNK_FRAMES)
        self._tail_hop = 1  # samples per position of the tail's input
        self._upsample = 1  # positions of the tail's input per latent frame (upsample_rates[0])
        self._head_context = 0  # frames on each side of a stream's window that its head run reads
        self._hop = 1
        self._channels = 0
        phonemes.prepare()

    def load(self, model_dir: Path) -> None:
        self._read_voice(model_dir)
        try:
            if (model_dir / CONFIG_FILE).exists():
                config = read_config(model_dir)
            else:
                # Published before vits.json: reading the receptive fields off the graph needs torch.
                from predictor.engine.convert import infer_config

                config = infer_config(model_dir / "model.onnx")
            parts = self._parts(model_dir, config.flow_n_flows)
            # The decoder's 2-D convolutions (exported_graph.planar_convolutions) in onnxruntime's blocked
            # layout: the head always, the tail on one thread (a lane's copy or a worker's, where it runs
            # once lanes exist), since on two its 32- and 64-channel convolutions split badly between the
            # threads: a 64-frame chunk 19.7 -> 26.3 ms, against 34.5 -> 29.2 on one (docs/benchmarks.md,
            # "The decoder's convolutions in 2-D"). A whole decoder.onnx predates them.
            plain, layout = self._options, self._layout_options
            decoder_options = (
                [layout, layout if self._threads == 1 else plain] if len(parts.decoder) == 2 else [plain]
            )
            sessions = [
                onnxruntime.InferenceSession(part, sess_options=o, providers=self._providers)
                for part, o in zip(
                    [parts.prior, *parts.flows, *parts.decoder],
                    [plain, *[self._flow_options] * len(parts.flows), *decoder_options],
                    strict=True,
                )
            ]
        except Exception as exc:  # onnxruntime and onnx raise their own untyped errors
            raise EngineError(f"cannot load the onnx voice from {model_dir}: {exc}") from exc
        self._prior, *self._flows = sessions[: 1 + len(parts.flows)]
        decoder = sessions[1 + len(parts.flows) :]
        self._decoder = decoder[0]
        self._tail = decoder[1] if len(decoder) == 2 else None
        self._context = windows.decoder_context_frames(config)
        # One flow.onnx reads the whole flow's context around a piece; a coupling layer its own.
        self._flow_contexts = (
            [windows.coupling_context_frames(config)] * len(self._flows)
            if parts.coupled
            else [windows.flow_context_frames(config)]
        )
        self._tail_context = windows.decoder_tail_context(config)
        self._head_context = windows.decoder_head_context(config)
        self._upsample = config.upsample_rates[0]
        self._tail_chunk = TAIL_CHUNK_FRAMES * self._upsample
        self._tail_hop = config.hop_length // self._upsample
        self._hop = config.hop_length
        self._channels = config.inter_channels

    @staticmethod
    def _parts(model_dir: Path, couplings: int) -> _Parts:
        """prior, flow and decoder: their files, or what publish would have written, made in memory
        from what an older artifact holds (onnx alone, no torch). An artifact with prior.onnx, its
        flow as coupling layers or one flow.onnx, and its decoder as head and tail or one
        decoder.onnx gives those, run as they are (no onnx import at cold start)."""
        stages = [model_dir / name for name in flow_stage_files(couplings)]
        coupled = all(path.exists() for path in stages)
        flows = stages if coupled else [model_dir / FLOW_ONNX]
        decoder = [model_dir / DECODER_HEAD_ONNX, model_dir / DECODER_TAIL_ONNX]
        if not all(path.exists() for path in decoder):
            decoder = [model_dir / DECODER_ONNX]
        if all(path.exists() for path in (model_dir / PRIOR_ONNX, *flows, *decoder)):
            return _Parts(
                str(model_dir / PRIOR_ONNX), [str(p) for p in flows], coupled, [str(p) for p in decoder]
            )
        import onnx

        from predictor.engine.exported_graph import (
            prepare_decoder,
            prepare_encoder,
            split_couplings,
            split_flow,
            split_onnx,
        )

        if (model_dir / ENCODER_ONNX).exists() and (model_dir / DECODER_ONNX).exists():
            # Split before the flow was cut off, maybe before the noise input and durations output.
            encoder = prepare_encoder(onnx.load(str(model_dir / ENCODER_ONNX)))
            head, tail = prepare_decoder(onnx.load(str(model_dir / DECODER_ONNX)))
        else:
            # Published before any split: publish's conversion of model.onnx.
            encoder, head, tail = split_onnx(model_dir / "model.onnx")
        prior, flow = split_flow(encoder)
        return _Parts(
            prior.SerializeToString(),
            [part.SerializeToString() for part in split_couplings(flow)],
            True,
            [head.SerializeToString(), tail.SerializeToString()],
        )

    @property
    def hop_length(self) -> int:
        return self._hop

    def _speaker_id(self, voice: str | None) -> int | None:
        # The voice was checked by synthesize / stream, or by the service for the whole request.
        if self.voice.num_speakers <= 1:
            return None
        return self.voice.speakers.get(voice, 0) if voice else 0

    def _scales(self, params: SynthesisParams) -> np.ndarray:
        voice = self.voice
        return np.array(
            [
                voice.noise_scale if params.noise_scale is None else params.noise_scale,
                voice.length_scale if params.length_scale is None else params.length_scale,
                voice.noise_w if params.noise_w is None else params.noise_w,
            ],
            dtype=np.float32,
        )

    def spoken(
        self, texts: Sequence[str], params: SynthesisParams
    ) -> list[tuple[np.ndarray, list[Sentence]]]:
        voice = self.voice
        speaker = self._speaker_id(params.voice)
        scales = self._scales(params)
        ids = [phonemes.sentence_ids(text, voice.espeak_voice, voice.phoneme_id_map) for text in texts]
        # Every sentence of the call: (its text's index, its noise seed, its phoneme ids).
        flat = [
            (item, _seed(params, item, k), s)
            for item, sentences in enumerate(ids)
            for k, s in enumerate(sentences)
        ]
        audio: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(flat)
        frames: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(flat)
        lanes = self._lanes
        if lanes is not None and len(flat) > 1:
            copy = lanes[1]
            lanes[0].run(
                [
                    partial(copy._sentence_task, seed, s, scales, speaker, audio, frames, i)
                    for i, (_, seed, s) in enumerate(flat)
                ]
            )
            audio = [_clipped(a) for a in audio]
        else:
            for i, (_, seed, s) in enumerate(flat):
                prior, mask, frames[i] = self._encode(s, scales, speaker, seed)
                audio[i] = self._decode(self._run_flow(prior, mask))
        out: list[tuple[list[np.ndarray], list[Sentence]]] = [([], []) for _ in texts]
        for (item, _, s), a, f in zip(flat, audio, frames, strict=True):
            out[item][0].append(a)
            out[item][1].append(Sentence(s, f))
        return [
            (np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32), sentences)
            for pieces, sentences in out
        ]

    def add_lanes(self, copy: Engine) -> bool:
        if not (self._chunked and isinstance(copy, OnnxEngine) and copy._threads < self._threads):
            return False
        self._lanes = (Lanes(self._threads // copy._threads), copy)
        return True

    def lane_threads(self) -> int | None:
        return 1 if self._chunked and self._threads >= 2 else None

    def stream_checked(
        self, text: str, params: SynthesisParams, sizes: StreamWindows
    ) -> Iterator[tuple[np.ndarray, bool]]:
        voice = self.voice
        speaker = self._speaker_id(params.voice)
        scales = self._scales(params)
        sentences = list(phonemes.sentence_ids(text, voice.espeak_voice, voice.phoneme_id_map))
        if not sentences:
            yield np.zeros(0, dtype=np.float32), True
        for k, ids in enumerate(sentences):
            prior, _, _ = self._encode(ids, scales, speaker, _seed(params, 0, k))
            n_frames = prior.shape[-1]
            # A window's head runs over its frames and _head_context more, its tail only over its own
            # positions and the tail's context (_decode_window); a whole decoder.onnx over the
            # generator's whole receptive field.
            context = self._context if self._tail is None else self._head_context
            plan = windows.plan(n_frames, sizes.first_of(k), sizes.frames, context)
            pieces = iter(windows.flow_runs(n_frames, plan[0].context_end, self._flow_contexts))
            # The prior's sample, then each flow stage's output [1, inter, F], filled piece by piece.
            stages = [prior, *(np.empty_like(prior) for _ in self._flows)]
            flowed = 0  # frames of the latent (the last stage's output) computed so far
            for n, w in enumerate(plan):
                while flowed < w.context_end:
                    flowed = self._flow_piece(stages, next(pieces))
                yield self._decode_window(stages[-1], w), k == len(sentences) - 1 and n == len(plan) - 1

    def _encode(
        self, ids: list[int], scales: np.ndarray, speaker: int | None, seed: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Phoneme ids -> the prior's sample z_p [1, inter, F], its frame mask [1, 1, F] and the frames
        of each id [T] (summing to F), the noise drawn from ``seed`` (engine/noise.py)."""
        assert self._prior is not None
        t = len(ids)
        feeds = {
            "input": np.asarray([ids], dtype=np.int64),  # [1, T]
            "input_lengths": np.asarray([t], dtype=np.int64),  # [1]
            "scales": scales,  # [3]: noise_scale, length_scale, noise_w
        }
        if speaker is not None:
            feeds["sid"] = np.asarray([speaker], dtype=np.int64)
        frames = int(np.ceil(t * FRAMES_PER_PHONEME * max(1.0, float(scales[1]))))
        while True:
            # [2 * T] for the duration predictor, then the prior's [inter * F] for F up to `frames`.
            feeds[NOISE_NAME] = noise.stream(seed).standard_normal(
                2 * t + self._channels * frames, dtype=np.float32
            )
            try:
                prior, mask, durations = self._prior.run(
                    [PRIOR_NAME, MASK_NAME, DURATIONS_NAME], feeds, self._quiet_run
                )
                return prior, mask, durations.reshape(-1).astype(np.int64)
            except onnxruntime.capi.onnxruntime_pybind11_state.Fail as exc:
                if f"{NOISE_NAME}/1/Reshape" not in str(exc):
                    raise
                frames *= 4

    def _flow_piece(self, stages: list[np.ndarray], piece: list[tuple[int, windows.Window]]) -> int:
        """One of windows.flow_runs' pieces: each run's frames of stage i + 1's output [1, inter, F]
        written into stages[i + 1] from stages[i] (stages[0] the prior's sample); the frames of the
        latent made so far (a piece ends with the last stage's run)."""
        for i, run in piece:
            out = self._run_stage(i, stages[i][:, :, run.context_start : run.context_end])
            stages[i + 1][:, :, run.start : run.end] = out[:, :, run.keep(1)]
        return piece[-1][1].end

    def _run_flow(self, prior: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The prior's sample [1, inter, F] and its frame mask [1, 1, F] -> latent [1, inter, F]."""
        for i in range(len(self._flows)):
            prior = self._run_stage(i, prior, mask)
        return prior

    def _run_stage(self, i: int, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Stage i of the flow (a coupling layer, or one flow.onnx) over x [1, inter, F]. A piece of
        one sentence is all frames, so its mask is ones."""
        if mask is None:
            mask = np.ones((1, 1, x.shape[-1]), dtype=np.float32)
        feeds = {PRIOR_NAME: np.ascontiguousarray(x), MASK_NAME: mask}
        return self._flows[i].run([LATENT_NAME], feeds)[0]

    def _decode(self, latent: np.ndarray) -> np.ndarray:
        """Latent frames [1, inter, F] -> audio [F * hop] float32 in [-1, 1]: one window of them all."""
        n = latent.shape[-1]
        return self._decode_window(latent, windows.Window(0, n, 0, n))

    def _decode_window(self, latent: np.ndarray, w: windows.Window) -> np.ndarray:
        """The samples of a stream's window w of the latent [1, inter, F], as the whole decode gives
        them: the head over w's context frames (_head_context on each side), then the tail over the
        head's outputs at w's own positions and the tail's context, which that context makes the
        whole run's; a whole decoder.onnx over w's context (the generator's receptive field)."""
        assert self._decoder is not None
        window = np.ascontiguousarray(latent[:, :, w.context_start : w.context_end])
        out = self._decoder.run(None, {LATENT_NAME: window})[0]
        # [1, 1, 1, S] from a whole decoder.onnx; [1, C, frames * upsample_rates[0]] from the head
        if self._tail is None:
            return _clipped(out)[w.keep(self._hop)]
        offset = (w.start - w.context_start) * self._upsample  # the window's first position in `out`
        return _clipped(self._run_tail(out, offset, offset + (w.end - w.start) * self._upsample))

    def _tail_bounds(self, start: int, end: int, parts: int = 1) -> list[int]:
        """Where the tail's chunks of the head's output positions [start, end) start and end: chunks of
        equal size, give or take one, about _tail_chunk each and a multiple of ``parts`` of them on CPU;
        one chunk on a GPU."""
        n = end - start
        chunks = parts * max(1, round(n / (parts * self._tail_chunk))) if self._chunked else 1
        return [start + n * k // chunks for k in range(chunks + 1)]

    def _run_tail(self, upsampled: np.ndarray, start: int = 0, end: int | None = None) -> np.ndarray:
        """The samples [start * tail_hop, end * tail_hop) of the tail over the head's output [1, C, P]
        (end None: P): whole, or on CPU chunk after chunk (_tail_piece), side by side where the engine
        has lanes."""
        assert self._tail is not None
        n = upsampled.shape[-1]
        end = n if end is None else end
        lanes = self._lanes
        if lanes is not None:
            audio = np.empty((end - start) * self._tail_hop, dtype=np.float32)
            # A lone sentence or a stream's window: its chunks side by side on the lanes' copy, as many
            # for each lane, since a lane left alone with the last chunk halves the CPUs at work
            # (docs/benchmarks.md, "A lone sentence's tail on lanes").
            lanes[0].run(lanes[1]._tail_tasks(upsampled, audio, lanes[0].n, start, end))
            return audio
        bounds = self._tail_bounds(start, end)
        if bounds == [0, n]:
            return self._tail.run(None, {UPSAMPLED_NAME: upsampled})[0]
        audio = np.empty((end - start) * self._tail_hop, dtype=np.float32)
        for a, b in itertools.pairwise(bounds):
            self._tail_piece(upsampled, a, b, audio, start)
        return audio

    def _tail_piece(
        self, upsampled: np.ndarray, start: int, end: int, audio: np.ndarray, origin: int
    ) -> None:
        """audio's samples of the head's output positions [start, end) (audio begins at position
        ``origin``), run with _tail_context positions more on either side (fewer at the ends, where the
        whole run sees the same zero padding) and only its own samples kept, which are the whole run's
        (the tail reaches no further; tests/system/test_engines.py)."""
        assert self._tail is not None
        n, hop, context = upsampled.shape[-1], self._tail_hop, self._tail_context
        lo, hi = max(0, start - context), min(n, end + context)
        window = np.ascontiguousarray(upsampled[:, :, lo:hi])
        piece = self._tail.run(None, {UPSAMPLED_NAME: window})[0].reshape(-1)
        audio[(start - origin) * hop : (end - origin) * hop] = piece[(start - lo) * hop : (end - lo) * hop]

    def _tail_tasks(
        self, upsampled: np.ndarray, audio: np.ndarray, parts: int = 1, start: int = 0, end: int | None = None
    ) -> list[Task]:
        """The tail's chunks of ``upsampled``'s positions [start, end) (a multiple of ``parts`` of them)
        as lanes' tasks, each writing its samples into ``audio`` (which begins at ``start``)."""
        bounds = self._tail_bounds(start, upsampled.shape[-1] if end is None else end, parts)
        return [
            partial(_tail_task, self, upsampled, a, b, audio, start) for a, b in itertools.pairwise(bounds)
        ]

    def _sentence_task(
        self,
        seed: int,
        ids: list[int],
        scales: np.ndarray,
        speaker: int | None,
        audio: list[np.ndarray],
        frames: list[np.ndarray],
        i: int,
    ) -> Sequence[Task]:
        """Sentence i of a call on lanes, run on this (one-thread) copy: text encoder, flow and first
        decoder stage here, the tail's chunks as the tasks that follow; audio[i] is filled unclipped."""
        prior, mask, frames[i] = self._encode(ids, scales, speaker, seed)
        assert self._decoder is not None
        out = self._decoder.run(None, {LATENT_NAME: self._run_flow(prior, mask)})[0]
        if self._tail is None:  # a whole decoder.onnx: nothing follows
            audio[i] = out
            return ()
        audio[i] = np.empty(out.shape[-1] * self._tail_hop, dtype=np.float32)
        return self._tail_tasks(out, audio[i])


def _session_options(device: str, threads: int, layout: bool) -> onnxruntime.SessionOptions:
    """A session's options: ``threads`` intra-op threads, one run at a time; on CPU no graph
    optimization unless ``layout``, which turns them all on for onnxruntime's blocked-channel layout."""
    options = onnxruntime.SessionOptions()
    if device == "cpu":
        # Measured on this voice: graph optimizations change CPU run time by < 2 % (the graph is
        # convolution-bound) but cost ~1 s of session creation, which holds the GIL through cold start.
        # The decoder's parts are the exception (planar_convolutions), at 5-7 ms of creation each.
        options.graph_optimization_level = (
            onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
            if layout
            else onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
    options.intra_op_num_threads = threads
    # One request at a time runs through the graph; parallelism lives inside each operator.
    options.inter_op_num_threads = 1
    if device == "cpu":
        # Spinning within a run, stopped when it returns: the voice runs as several sessions (prior,
        # flow, decoder), each with its own intra-op pool, and a pool left spinning after its run held
        # the CPUs the next one needed (and the event loop's): the engine alone on 2 CPUs took 135-148
        # ms for 26 characters against 89-92 ms with no spinning at all. Stopping it at the end of each
        # run keeps that away, and spinning between a run's operators saves each one's wake-up: 26 / 99
        # characters and three sentences 67.5-67.8 / 263-278 / 413-417 ms without spinning, 61.7-62.5 /
        # 249-259 / 388-396 ms so (docs/benchmarks.md, "The upsampling as convolutions").
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


@cache
def _shared_arena() -> None:
    """One CPU arena in onnxruntime's environment, registered once a process, for the sessions that
    ask for it (``session.use_env_allocators``): the flow's coupling layers, which run one after the
    other and so need one layer's peak at a time, not one each."""
    info = onnxruntime.OrtMemoryInfo(
        "Cpu", onnxruntime.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, onnxruntime.OrtMemType.DEFAULT
    )
    onnxruntime.create_and_register_allocator(info, None)


def _tail_task(
    engine: OnnxEngine, upsampled: np.ndarray, start: int, end: int, audio: np.ndarray, origin: int
) -> Sequence[Task]:
    engine._tail_piece(upsampled, start, end, audio, origin)
    return ()


def _clipped(audio: np.ndarray) -> np.ndarray:
    """The decoder's output as flat float32 samples in [-1, 1]."""
    return np.clip(audio.reshape(-1), -1.0, 1.0).astype(np.float32, copy=False)


def _seed(params: SynthesisParams, item: int, k: int) -> int:
    """The noise seed of sentence k of the call's item ``item`` (engine/noise.py), else a fresh one."""
    return noise.fresh_seed() if params.seed is None else noise.sentence_seed(params.seed, item, k)
