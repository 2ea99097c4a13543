"""Audio encodings for the OpenAI-compatible ``POST /v1/audio/speech`` route.

``response_format`` is one of wav | pcm | flac | mp3 | opus, as one whole file (``encode``) or as a
stream of chunks sent as each sentence's audio arrives (``StreamEncoder``). The containers and codecs
are libsndfile's (through soundfile), not hand-written encoders; only the 44-byte streaming WAV header
and raw PCM are written here. ``supported_formats()`` is what this libsndfile build can really do
(MP3 needs libsndfile >= 1.1 built with LAME/mpg123, Ogg/Opus >= 1.0.29 built with libopus); a format
it lacks is refused with ``BadRequest`` naming the ones it has, never faked.

Sample conversion: float audio is clipped to [-1, 1], scaled by 32767 and rounded to the nearest
integer (NaN becomes 0), so full scale maps to +/-32767 and values past it saturate instead of
wrapping. Every format is fed these 16-bit samples, so the lossless ones (wav, pcm, flac) decode to
exactly ``to_pcm16(audio)``.

Per-format decisions, each checked by tests/unit/test_audio.py:

* wav: whole files are 16-bit PCM from libsndfile. A stream cannot know its length up front, so its
  header carries 0xFFFFFFFF in the RIFF and data size fields ("unknown length", what streaming WAV
  servers send; browsers, ffmpeg, libsndfile and Python's ``wave`` accept it and read to the end of
  the data), followed by the raw frames.
* pcm: what OpenAI returns for "pcm": headerless signed 16-bit little-endian mono samples, here at
  the output sample rate (the model's), which the client must be told out of band.
* flac: streamed as libFLAC writes it. On close the writer seeks back to fill STREAMINFO's min/max
  frame size, total samples and MD5, which a stream has already sent; the streamed header keeps them
  0, which the FLAC format defines as "unknown" (as any piped FLAC encoder writes them). Every other
  byte equals the whole file. Decoders that need the total length up front (soundfile's ``read``,
  for one) cannot read such a stream in one call; players, ffmpeg and libFLAC's stream decoder can.
* mp3: constant bitrate (64 kbit/s mono at 16-24 kHz, 128 above, 32 below). On close LAME seeks
  back to fill its Xing/Info tag frame with the frame count and gapless (encoder delay and padding)
  data; a stream sent that frame while it was still a zeroed placeholder, which decoders play as one
  silent frame. So the streamed file also starts with LAME's encoder delay (about 0.05 s) instead of
  having it trimmed, and ends with up to a frame of padding. CBR, not VBR, because decoders estimate
  a tagless stream's length from the first frame's bitrate: with VBR, libsndfile (mpg123) stops a
  decoded stream far short of its end.
* opus: Ogg/Opus written append-only, no seeking back. libsndfile's Opus accepts only 8, 12, 16, 24
  and 48 kHz, so other rates are resampled to the next higher of those (22050 -> 24000) by
  ``Resampler`` below (scipy is not a dependency). Ogg pages are flushed every
  ``OPUS_PAGE_LATENCY_MS`` of audio instead of libsndfile's default second, so a sentence's audio
  leaves with its own chunk, not with the next one. Opus keeps its pre-skip, so the decoded length
  equals the resampled input's length.

Empty audio: libsndfile writes no FLAC or MP3 file, and no readable Ogg/Opus one, for zero samples,
so ``encode`` refuses it (ValueError); the route should reject empty input before synthesis. A stream
that ends with no audio has an empty body for those formats.

Lossy formats cannot round-trip exactly: tests require correlation > 0.9 against the input. Every
encoder also holds back a little audio until the next chunk or ``finish`` (a FLAC block of 4096
samples, an MP3 frame plus LAME's lookahead, a 20 ms Opus frame and the current Ogg page)."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import soundfile

from predictor.audio.resample import Resampler
from predictor.errors import BadRequest

# Ogg page flush interval for Opus streams (libsndfile's default is 1000 ms). Each page costs ~30
# bytes of framing, so 100 ms pages add ~2.4 kbit/s while keeping a chunk's audio in its own chunk.
OPUS_PAGE_LATENCY_MS = 100.0


# libsndfile's command for that setting (sndfile.h SFC_SET_OGG_PAGE_LATENCY_MS, since 1.0.29); the
# soundfile binding does not declare it, so it is sent through soundfile's generic sf_command.
_SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302


# WAV's "unknown length" marker for the RIFF and data chunk sizes of a streamed file.
WAV_UNKNOWN_SIZE = 0xFFFFFFFF


_PCM16_SCALE = 32767.0


@dataclass(frozen=True)
class Format:
    """One ``response_format``: how it is labelled, which libsndfile writer makes it, what it accepts."""

    name: str
    media_type: str
    # libsndfile major format and subtype; None for raw pcm, which needs no container.
    sf_format: str | None
    sf_subtype: str
    streamable: bool
    lossy: bool
    # About what encoding a second of audio costs one CPU, in microseconds, resampling included: how
    # serving/offload.py tells an encode too small to leave the event loop for (``encode_us``).
    # Measured on a 2-CPU Xeon (Sapphire Rapids), 1.5 s and 10 s of 22,050 Hz audio, the larger
    # figure rounded up: wav 47-152, pcm 32-166, flac 254-575, mp3 6,439-7,628, opus 34,222-35,267.
    encode_us_per_s: int
    # Sample rates the codec accepts; None means any. Other rates are resampled (see output_sample_rate).
    sample_rates: tuple[int, ...] | None = None


FORMATS: dict[str, Format] = {
    "wav": Format("wav", "audio/wav", "WAV", "PCM_16", streamable=True, lossy=False, encode_us_per_s=200),
    "pcm": Format("pcm", "audio/pcm", None, "PCM_16", streamable=True, lossy=False, encode_us_per_s=200),
    "flac": Format("flac", "audio/flac", "FLAC", "PCM_16", streamable=True, lossy=False, encode_us_per_s=600),
    "mp3": Format(
        "mp3",
        "audio/mpeg",
        "MP3",
        "MPEG_LAYER_III",
        streamable=True,
        lossy=True,
        encode_us_per_s=8000,
        sample_rates=(8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    ),
    "opus": Format(
        "opus",
        "audio/ogg",
        "OGG",
        "OPUS",
        streamable=True,
        lossy=True,
        encode_us_per_s=36000,
        sample_rates=(8000, 12000, 16000, 24000, 48000),
    ),
}


def supported_formats() -> list[str]:
    """The response formats this soundfile/libsndfile build can encode, in ``FORMATS`` order.

    A format counts only if libsndfile lists its container and codec and a 20 ms trial encode works
    (checked once per process).
    """
    return list(_supported())


@lru_cache(maxsize=1)
def _supported() -> tuple[str, ...]:
    return tuple(name for name, fmt in FORMATS.items() if _works(fmt))


def _works(fmt: Format) -> bool:
    if fmt.sf_format is None:
        return True
    try:
        if fmt.sf_format not in soundfile.available_formats():
            return False
        if fmt.sf_subtype not in soundfile.available_subtypes(fmt.sf_format):
            return False
        rate = 24000 if fmt.sample_rates is None else fmt.sample_rates[-1]
        _encode_file(np.zeros(rate // 50, dtype=np.int16), rate, fmt)
    except Exception:
        return False
    return True


def get_format(name: str) -> Format:
    """The ``Format`` for a ``response_format``; ``BadRequest`` naming the supported ones otherwise."""
    supported = supported_formats()
    if name not in supported:
        if name in FORMATS:
            why = f"is not available in this server's libsndfile ({soundfile.__libsndfile_version__})"
        else:
            why = "is not a known format"
        raise BadRequest(f"response_format {name!r} {why}; supported: {', '.join(supported)}")
    return FORMATS[name]


def output_sample_rate(fmt: str | Format, sample_rate: int) -> int:
    """The sample rate the encoded audio has: the input's, or the codec's next higher allowed rate."""
    f = fmt if isinstance(fmt, Format) else get_format(fmt)
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    if f.sample_rates is None or sample_rate in f.sample_rates:
        return sample_rate
    higher = [r for r in f.sample_rates if r >= sample_rate]
    return higher[0] if higher else f.sample_rates[-1]


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    """Mono float audio as int16 samples: clip to [-1, 1], scale by 32767, round; NaN becomes 0."""
    x = _as_mono(audio)
    if x.dtype == np.int16:
        return x
    # In place on one float64 copy, NaN looked for once: np.nan_to_num's passes (isnan, isposinf,
    # isneginf, copies) made this 0.9 ms of a medium sentence's 135k samples, now 0.16 ms, same samples.
    y = x.astype(np.float64)
    np.clip(y, -1.0, 1.0, out=y)  # infinities become +-1; NaN passes through
    y *= _PCM16_SCALE
    np.rint(y, out=y)
    nan = np.isnan(y)
    if nan.any():
        y[nan] = 0.0
    return y.astype(np.int16)


def encode_us(fmt: str | Format, samples: int, sample_rate: int) -> int:
    """About how many microseconds of one CPU encoding ``samples`` samples at ``sample_rate`` in
    ``fmt`` takes (``Format.encode_us_per_s``)."""
    f = fmt if isinstance(fmt, Format) else get_format(fmt)
    return samples * f.encode_us_per_s // sample_rate


def encode(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """``audio`` (mono float in [-1, 1]) as one complete file in ``fmt``, with its full headers."""
    f = get_format(fmt)
    out_rate = output_sample_rate(f, sample_rate)
    x = _as_mono(audio)
    if out_rate != sample_rate:
        x = Resampler(sample_rate, out_rate).resample(to_float(x))
    pcm = to_pcm16(x)
    if len(pcm) == 0 and f.name not in ("wav", "pcm"):
        raise ValueError(f"cannot encode zero samples as {f.name}: libsndfile writes no valid file for them")
    if f.sf_format is None:
        return pcm.astype("<i2", copy=False).tobytes()
    return _encode_file(pcm, out_rate, f)


def to_float(audio: np.ndarray) -> np.ndarray:
    """Mono audio as float32; int16 input is scaled back by 1/32767."""
    x = _as_mono(audio)
    if x.dtype == np.int16:
        return (x / _PCM16_SCALE).astype(np.float32)
    return x.astype(np.float32, copy=False)


class StreamEncoder:
    """Encodes one response as chunks that can be sent as soon as each sentence's audio arrives.

    ``header() + encode_chunk(a1) + encode_chunk(a2) + ... + finish()`` is a playable file of the
    concatenated audio; how it differs from ``encode`` of that audio is in the module docstring.
    ``header`` is optional: its bytes are sent exactly once, by whichever call comes first. It can be
    empty (libsndfile writes FLAC/MP3 headers with the first audio). Call ``close`` to abandon a
    stream (client went away) without ``finish``.
    """

    def __init__(self, fmt: str, sample_rate: int):
        self.format = get_format(fmt)
        if not self.format.streamable:
            streamable = [n for n in supported_formats() if FORMATS[n].streamable]
            raise BadRequest(
                f"response_format {fmt!r} cannot be streamed; streamable: {', '.join(streamable)}"
            )
        self.sample_rate = sample_rate
        self.output_rate = output_sample_rate(self.format, sample_rate)
        self.media_type = self.format.media_type
        self._resampler = (
            Resampler(sample_rate, self.output_rate) if self.output_rate != sample_rate else None
        )
        self._sink: _AppendOnlySink | None = None
        self._file: soundfile.SoundFile | None = None
        self._pending = b""
        self._finished = False
        if self.format.name == "wav":
            self._pending = wav_stream_header(self.output_rate)
        elif self.format.sf_format is not None:
            self._sink = _AppendOnlySink()
            self._file = _open_writer(self._sink, self.output_rate, self.format)

    def header(self) -> bytes:
        """Bytes that go before any audio (the WAV header; whatever the writer has produced so far)."""
        self._check_open()
        return self._take()

    def encode_chunk(self, audio: np.ndarray) -> bytes:
        """Encode the next piece of audio; return every byte that is final now."""
        self._check_open()
        x = _as_mono(audio)
        if self._resampler is not None:
            x = self._resampler.process(to_float(x))
        self._write(to_pcm16(x))
        return self._take()

    def finish(self) -> bytes:
        """Flush the encoder and end the stream; return the remaining bytes."""
        self._check_open()
        if self._resampler is not None:
            self._write(to_pcm16(self._resampler.flush()))
        if self._file is not None:
            self._file.close()
        self._finished = True
        return self._take()

    def close(self) -> None:
        """Abandon the stream, releasing the encoder; nothing more is returned."""
        self._finished = True
        if self._file is not None and not self._file.closed:
            self._file.close()
        self._pending = b""

    @property
    def rewrites(self) -> list[tuple[int, bytes]]:
        """(offset, bytes) the writer patched into bytes already returned (see module docstring)."""
        return list(self._sink.rewrites) if self._sink is not None else []

    def _write(self, pcm: np.ndarray) -> None:
        if len(pcm) == 0:
            return
        if self._file is not None:
            self._file.write(pcm)
        else:  # wav and pcm: the frames themselves
            self._pending += pcm.astype("<i2", copy=False).tobytes()

    def _take(self) -> bytes:
        out = self._pending
        self._pending = b""
        if self._sink is not None:
            out += self._sink.take()
        return out

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("this stream is finished")


def wav_stream_header(sample_rate: int) -> bytes:
    """A 44-byte RIFF/WAVE header for mono 16-bit PCM whose RIFF and data sizes are "unknown"."""
    block_align = 2  # one channel of 16-bit samples
    fmt_chunk = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * block_align, block_align, 16)
    return (
        b"RIFF"
        + struct.pack("<I", WAV_UNKNOWN_SIZE)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt_chunk))
        + fmt_chunk
        + b"data"
        + struct.pack("<I", WAV_UNKNOWN_SIZE)
    )


class _AppendOnlySink:
    """Write-only file object for libsndfile that hands out bytes as soon as they are written.

    libsndfile may seek back and patch a header it wrote earlier (FLAC STREAMINFO, MP3 Info tag).
    Those bytes were already handed out, so the patch is recorded in ``rewrites`` and otherwise
    dropped; writes at or past the end are appended and handed out by ``take``. Only the positions
    are tracked, not the data, so a long stream costs no memory here.
    """

    def __init__(self) -> None:
        self._pos = 0
        self._end = 0
        self._out = bytearray()
        self.rewrites: list[tuple[int, bytes]] = []

    def write(self, data: Any) -> int:
        b = bytes(data)
        if self._pos > self._end:  # a seek past the end leaves a hole, which reads as zeros
            self._out += bytes(self._pos - self._end)
            self._end = self._pos
        overlap = min(len(b), self._end - self._pos)
        if overlap > 0:
            self.rewrites.append((self._pos, b[:overlap]))
        self._out += b[overlap:]
        self._pos += len(b)
        self._end = max(self._end, self._pos)
        return len(b)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._end}[whence]
        if base + offset < 0:
            raise OSError("negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        raise io.UnsupportedOperation("this sink is write-only")

    def take(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out


def _as_mono(audio: np.ndarray) -> np.ndarray:
    x = np.asarray(audio)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 1:
        raise ValueError(f"expected mono 1-D audio, got shape {x.shape}")
    if x.dtype != np.int16 and not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"expected float or int16 audio, got {x.dtype}")
    return x


def _writer_options(fmt: Format, sample_rate: int) -> dict:
    if fmt.sf_format != "MP3":
        return {}
    # libsndfile maps compression level c to a CBR bitrate of int(high - c * (high - low)) kbit/s,
    # over a range set by the MPEG version the sample rate implies; aim half a unit high so the
    # truncation lands on the target.
    if sample_rate >= 32000:
        low, high, kbps = 32, 320, 128
    elif sample_rate >= 16000:
        low, high, kbps = 8, 160, 64
    else:
        low, high, kbps = 8, 64, 32
    return {"bitrate_mode": "CONSTANT", "compression_level": (high - kbps - 0.5) / (high - low)}


def _open_writer(file: Any, sample_rate: int, fmt: Format) -> soundfile.SoundFile:
    sf = soundfile.SoundFile(
        file,
        "w",
        samplerate=sample_rate,
        channels=1,
        format=fmt.sf_format,
        subtype=fmt.sf_subtype,
        **_writer_options(fmt, sample_rate),
    )
    if fmt.sf_format == "OGG" and fmt.sf_subtype == "OPUS":
        _set_ogg_page_latency(sf, OPUS_PAGE_LATENCY_MS)
    return sf


def _set_ogg_page_latency(sf: soundfile.SoundFile, ms: float) -> None:
    # Uses soundfile's private cffi handles; if they change, pages just stay at the 1 s default.
    try:
        ffi, lib, handle = soundfile._ffi, soundfile._snd, sf._file
        value = ffi.new("double*", ms)
        lib.sf_command(handle, _SFC_SET_OGG_PAGE_LATENCY_MS, value, ffi.sizeof("double"))
    except Exception:
        pass


def _encode_file(pcm: np.ndarray, sample_rate: int, fmt: Format) -> bytes:
    buf = io.BytesIO()
    with _open_writer(buf, sample_rate, fmt) as sf:
        if len(pcm):
            sf.write(pcm)
    return buf.getvalue()


def encoded_size_bound(seconds: float, fmt: Format, sample_rate: int) -> int:
    """Bytes ``seconds`` of mono audio cannot exceed in ``fmt``: 16-bit PCM at the format's output rate
    (no supported format is larger: FLAC, MP3 and Opus compress it), plus room for container headers."""
    return int(seconds * output_sample_rate(fmt, sample_rate) * 2) + 1024
