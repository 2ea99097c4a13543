"""Piper/VITS voices on our own PyTorch graph (engine/vits.py), loaded from safetensors.

On a GPU, the sentences of all texts in a request share padded batches (sorted by length, so padding
stays small); on CPU they run one by one (config.device_batch_size). Every sentence comes back trimmed
to its own duration sum x hop length and the sentences of each text are joined in order. A request's
`seed` seeds one noise stream per sentence (engine/noise.py, the one the onnx engine draws from too),
so the audio is reproducible whatever shares the batch, and the same on either engine.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from predictor.config import device_batch_size
from predictor.engine import device as devices
from predictor.engine import noise, phonemes, windows
from predictor.engine.base import PiperEngine, StreamWindows, SynthesisParams
from predictor.engine.vits import Vits
from predictor.engine.voice_files import load_vits
from predictor.engine.words import Sentence
from predictor.errors import EngineError

log = logging.getLogger("predictor.engine.native")


class TorchEngine(PiperEngine):
    name = "torch"
    supports_seed = True

    def __init__(
        self,
        device: str,
        dtype: str,
        threads: int,
        gpu_memory_fraction: float,
        compile: bool,
        sentences_per_batch: int | None = None,
    ):
        self.plan = devices.plan(device, dtype, threads, gpu_memory_fraction)
        # Sentences per forward pass: the device's measured best unless a caller (bench, tests) sets it.
        self.sentences_per_batch = sentences_per_batch or device_batch_size(device)
        self._compile = compile
        self._model: Vits | None = None
        phonemes.prepare()

    def load(self, model_dir: Path) -> None:
        self._read_voice(model_dir)
        try:
            model = load_vits(model_dir, device=self.plan.device, decoder_dtype=self.plan.decoder_dtype)
        except (OSError, ValueError, RuntimeError) as exc:
            raise EngineError(f"cannot load the torch VITS weights from {model_dir}: {exc}") from exc
        if self._compile:
            # Frame counts vary per request: compile once for dynamic lengths, never per new length.
            model.dec = torch.compile(model.dec, dynamic=True)  # type: ignore[assignment]
        self._model = model
        self._context = windows.decoder_context_frames(model.config)

    def warmup(self, text: str) -> None:
        # Two lengths: the second makes torch.compile (if on) settle on its dynamic-shape graph and
        # lets oneDNN/cuDNN pick kernels for more than one size before the first user arrives.
        quiet = SynthesisParams(noise_scale=0.0, noise_w=0.0, seed=0)
        self.synthesize([text], quiet)
        self.synthesize([f"{text} {text}"], quiet)
        if self._compile:
            # torch.compile guards its dynamic graph to the frame counts it saw: a short utterance
            # (under ~1.2 s) gets a graph of its own, built here rather than on a user's request.
            self.synthesize(["Hi."], quiet)

    def spoken(
        self, texts: Sequence[str], params: SynthesisParams
    ) -> list[tuple[np.ndarray, list[Sentence]]]:
        voice = self.voice
        # (text index, its sentence's index in the text, phoneme ids) for every sentence, in reading order.
        sentences = [
            (i, k, ids)
            for i, text in enumerate(texts)
            for k, ids in enumerate(phonemes.sentence_ids(text, voice.espeak_voice, voice.phoneme_id_map))
        ]
        spoken: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(sentences)
        # Sorted by length, so a batch pads its sentences to similar lengths.
        order = sorted(range(len(sentences)), key=lambda n: len(sentences[n][2]), reverse=True)
        per_batch = self.sentences_per_batch
        for start in range(0, len(order), per_batch):
            batch = order[start : start + per_batch]
            seeds = (
                None
                if params.seed is None
                else [noise.sentence_seed(params.seed, *sentences[n][:2]) for n in batch]
            )
            for n, result in zip(
                batch, self._run([sentences[n][2] for n in batch], seeds, params), strict=True
            ):
                spoken[n] = result
        out: list[tuple[list[np.ndarray], list[Sentence]]] = [([], []) for _ in texts]
        for (i, _, ids), sentence in zip(sentences, spoken, strict=True):
            assert sentence is not None  # every sentence index is in exactly one batch
            out[i][0].append(sentence[0])
            out[i][1].append(Sentence(ids, sentence[1]))
        return [
            (np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32), said) for parts, said in out
        ]

    def stream_checked(
        self, text: str, params: SynthesisParams, sizes: StreamWindows
    ) -> Iterator[tuple[np.ndarray, bool]]:
        """Per sentence: text encoder, durations and flow at once, then the decoder window by window.

        Sentence k draws its noise as sentence k of a call's first item does in synthesize
        (engine/noise.py), so a seeded stream joins into the same audio as the seeded whole."""
        assert self._model is not None
        voice, device, model = self.voice, self.plan.device, self._model
        sentences = list(phonemes.sentence_ids(text, voice.espeak_voice, voice.phoneme_id_map))
        hop = model.config.hop_length
        if not sentences:
            yield np.zeros(0, dtype=np.float32), True
        for k, ids in enumerate(sentences):
            generator = None if params.seed is None else noise.stream(noise.sentence_seed(params.seed, 0, k))
            with torch.inference_mode():
                z, _, _ = model.latent(
                    torch.tensor([ids], dtype=torch.long, device=device),
                    torch.tensor([len(ids)], dtype=torch.long, device=device),
                    *self._scales(params),
                    generator=generator,
                )
            plan = windows.plan(z.size(-1), sizes.first_of(k), sizes.frames, self._context)
            for n, w in enumerate(plan):
                with torch.inference_mode():
                    audio = model.decode(z[:, :, w.context_start : w.context_end])[0, w.keep(hop)]
                    pcm = audio.clamp_(-1.0, 1.0).cpu().numpy()
                yield pcm, k == len(sentences) - 1 and n == len(plan) - 1

    @property
    def hop_length(self) -> int:
        assert self._model is not None
        return self._model.config.hop_length

    def _scales(self, params: SynthesisParams) -> tuple[float, float, float]:
        """(noise_scale, length_scale, noise_w): the request's, else the voice's own."""
        voice = self.voice
        return (
            voice.noise_scale if params.noise_scale is None else params.noise_scale,
            voice.length_scale if params.length_scale is None else params.length_scale,
            voice.noise_w if params.noise_w is None else params.noise_w,
        )

    def _run(
        self, batch_ids: list[list[int]], seeds: list[int] | None, params: SynthesisParams
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """(audio, frames per id) of each sentence of a batch; ``seeds``: each one's noise seed."""
        assert self._model is not None
        device = self.plan.device
        lengths = torch.tensor([len(ids) for ids in batch_ids], dtype=torch.long)
        ids = torch.zeros((len(batch_ids), int(lengths.max())), dtype=torch.long)  # [B, T], 0 = pad
        for row, seq in zip(ids, batch_ids, strict=False):
            row[: len(seq)] = torch.tensor(seq, dtype=torch.long)
        # Seeded by the sentence's place in its item, not in the batch: reproducible alone or batched.
        generators = None if seeds is None else [noise.stream(seed) for seed in seeds]
        with torch.inference_mode():
            result = self._model.infer(
                ids.to(device), lengths.to(device), *self._scales(params), generator=generators
            )
            audio = result.audio.float().clamp_(-1.0, 1.0).cpu().numpy()  # [B, S]
            n = result.audio_lengths.cpu().tolist()
            frames = result.durations.cpu().numpy().astype(np.int64)  # [B, T]
        return [
            (audio[row, : n[row]].copy(), frames[row, : len(seq)].copy()) for row, seq in enumerate(batch_ids)
        ]
