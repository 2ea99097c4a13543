"""The engine interface every synthesis backend implements.

Lifecycle, in the order cold start runs it (so construction overlaps the weight download):

    engine = create(settings)      # heavy imports, device checks, phonemizer data: no weights yet
    engine.load(model_dir)         # weights from the verified artifact onto the device
    engine.warmup(text)            # first synthesis: allocations, kernel selection, compilation
    engine.synthesize(texts, params) -> list of float32 mono arrays, one per text
    engine.stream(text, params, windows) -> (float32 audio, last) per decoder window, in order

Engines are driven by one thread at a time (the predictor serializes calls); they need not be
thread-safe. A batch may hold texts of any length; every item comes back trimmed to its own length."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from predictor.engine.noise import SEED_LIMIT
from predictor.engine.words import Sentence, Word, words
from predictor.errors import BadRequest, EngineError

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class SynthesisParams:
    """Per-request knobs; None means the voice's own default from its config."""

    length_scale: float | None = None
    noise_scale: float | None = None
    noise_w: float | None = None
    voice: str | None = None
    seed: int | None = None  # None: fresh noise on every call

    # Inclusive bounds outside which VITS output is garbage or the request is a mistake.
    LIMITS: ClassVar[dict[str, tuple[float, float]]] = {
        "length_scale": (0.1, 5.0),
        "noise_scale": (0.0, 2.0),
        "noise_w": (0.0, 2.0),
    }

    def __post_init__(self) -> None:
        for name, (lo, hi) in self.LIMITS.items():
            value = getattr(self, name)
            if value is not None and not (lo <= value <= hi):
                raise BadRequest(f"parameter {name}={value} is out of range [{lo}, {hi}]")
        if self.seed is not None and not (0 <= self.seed < SEED_LIMIT):
            raise BadRequest(f"parameter seed={self.seed} is out of range [0, 2**62)")


@dataclass(frozen=True)
class VoiceConfig:
    """What an engine needs from the artifact's config.json (Piper's voice config)."""

    name: str
    sample_rate: int
    espeak_voice: str
    phoneme_id_map: dict[str, list[int]]
    length_scale: float
    noise_scale: float
    noise_w: float
    num_speakers: int
    speakers: dict[str, int]

    @classmethod
    def read(cls, model_dir: Path, name: str) -> VoiceConfig:
        try:
            raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
            inference = raw.get("inference", {})
            return cls(
                name=name,
                sample_rate=int(raw["audio"]["sample_rate"]),
                espeak_voice=str(raw["espeak"]["voice"]),
                phoneme_id_map={k: list(v) for k, v in raw["phoneme_id_map"].items()},
                length_scale=float(inference.get("length_scale", 1.0)),
                noise_scale=float(inference.get("noise_scale", 0.667)),
                noise_w=float(inference.get("noise_w", 0.8)),
                num_speakers=int(raw.get("num_speakers", 1)),
                speakers=dict(raw.get("speaker_id_map", {})),
            )
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"voice config {model_dir / 'config.json'} is unusable: {exc}") from exc


@dataclass(frozen=True)
class StreamWindows:
    """Decoder window sizes of a streamed synthesis, in latent frames (STREAM_*_WINDOW_FRAMES)."""

    first_frames: int
    frames: int

    def first_of(self, sentence: int) -> int:
        """The first window of the stream's sentence number ``sentence``: short for the first
        sentence only, which sets the time to first audio; a later one starts while the earlier
        ones play, so it takes a whole window and pays the context (and the flow's split) less."""
        return self.first_frames if sentence == 0 else self.frames

    def following(self) -> StreamWindows:
        """The windows of a text that continues a stream (a request's later segment): its first
        sentence too starts while earlier audio plays, so none starts with the short window."""
        return StreamWindows(self.frames, self.frames)


class Engine(ABC):
    """A loaded voice on a device."""

    name: str
    supports_seed: bool = False  # whether SynthesisParams.seed makes the noise reproducible

    @abstractmethod
    def load(self, model_dir: Path) -> None: ...

    @abstractmethod
    def synthesize(self, texts: Sequence[str], params: SynthesisParams) -> list[np.ndarray]:
        """The audio of each text, for a caller that drives the engine directly (CLI, bench): the
        voice is checked here."""

    def synthesize_checked(self, texts: Sequence[str], params: SynthesisParams) -> list[np.ndarray]:
        """synthesize for the service, which checked the voice once for the request before queueing it.
        Engines whose synthesize checks the voice override this to skip that check."""
        return self.synthesize(texts, params)

    def align_checked(
        self, texts: Sequence[str], params: SynthesisParams
    ) -> list[tuple[np.ndarray, list[Word]]]:
        """Each text's audio and when each of its written words is spoken in it (samples), from the
        model's own durations (engine/words.py); the noise as synthesize's, the voice checked by the
        caller."""
        raise EngineError(f"ENGINE={self.name} cannot tell how long each phoneme lasted")

    @property
    @abstractmethod
    def sample_rate(self) -> int: ...

    @property
    @abstractmethod
    def voices(self) -> list[str]: ...

    def check_voice(self, voice: str | None) -> None:
        """The one check of a requested voice, for the service and for engines driven directly (CLI)."""
        if voice is not None and voice not in self.voices:
            raise BadRequest(f"unknown voice {voice!r}; this model serves {self.voices}")

    def lane_threads(self) -> int | None:
        """The intra-op threads of a copy whose sessions would let this engine run one call's sentences
        side by side (add_lanes), or None where it would not use one."""
        return None

    def add_lanes(self, copy: Engine) -> bool:
        """Run each call's sentences and decoder chunks side by side from now on, the lanes on ``copy``'s
        sessions (a loaded copy with fewer threads, which may also serve calls of its own); whether this
        engine took it (engine/lanes.py)."""
        return False

    def warmup(self, text: str) -> None:
        self.synthesize([text], SynthesisParams(noise_scale=0.0, noise_w=0.0))

    def stream(
        self, text: str, params: SynthesisParams, windows: StreamWindows
    ) -> Iterator[tuple[np.ndarray, bool]]:
        """The audio of `text` in pieces as they are decoded, each with whether it is the last.

        Concatenated, the pieces equal synthesize([text]) for the same noise. This default yields the
        whole at once; engines that can decode in windows override it. The caller may stop iterating
        at any piece: no further work is done.
        """
        yield self.synthesize([text], params)[0], True

    def stream_checked(
        self, text: str, params: SynthesisParams, windows: StreamWindows
    ) -> Iterator[tuple[np.ndarray, bool]]:
        """stream for the service, which checked the voice once for the request (see synthesize_checked)."""
        return self.stream(text, params, windows)


class PiperEngine(Engine):
    """An engine for a Piper voice: the voice config comes from the artifact's config.json."""

    _voice: VoiceConfig | None = None

    def _read_voice(self, model_dir: Path) -> VoiceConfig:
        manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
        self._voice = VoiceConfig.read(model_dir, manifest["name"])
        return self._voice

    def synthesize(self, texts: Sequence[str], params: SynthesisParams) -> list[np.ndarray]:
        self.check_voice(params.voice)
        return self.synthesize_checked(texts, params)

    def synthesize_checked(self, texts: Sequence[str], params: SynthesisParams) -> list[np.ndarray]:
        return [audio for audio, _ in self.spoken(texts, params)]

    def align_checked(
        self, texts: Sequence[str], params: SynthesisParams
    ) -> list[tuple[np.ndarray, list[Word]]]:
        voice, hop = self.voice, self.hop_length
        return [
            (audio, words(text, sentences, hop, voice.espeak_voice, voice.phoneme_id_map))
            for text, (audio, sentences) in zip(texts, self.spoken(texts, params), strict=True)
        ]

    @abstractmethod
    def spoken(
        self, texts: Sequence[str], params: SynthesisParams
    ) -> list[tuple[np.ndarray, list[Sentence]]]:
        """Each text's audio and its sentences' phoneme ids and frames, in reading order."""

    @property
    @abstractmethod
    def hop_length(self) -> int:
        """Samples per latent frame."""

    def stream(
        self, text: str, params: SynthesisParams, windows: StreamWindows
    ) -> Iterator[tuple[np.ndarray, bool]]:
        self.check_voice(params.voice)
        return self.stream_checked(text, params, windows)

    @property
    def voice(self) -> VoiceConfig:
        if self._voice is None:
            raise EngineError("engine used before load()")
        return self._voice

    @property
    def sample_rate(self) -> int:
        return self.voice.sample_rate

    @property
    def voices(self) -> list[str]:
        return [self.voice.name, *self.voice.speakers]
