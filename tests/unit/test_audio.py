"""Encodings for /v1/audio/speech: whole files and chunked streams decode to the input."""

from __future__ import annotations

import io
import itertools
import struct
import wave

import numpy as np
import pytest
import soundfile

from predictor.audio import codecs, resample
from predictor.errors import BadRequest

RATE = 22050
SUPPORTED = codecs.supported_formats()
LOSSLESS = [f for f in SUPPORTED if not codecs.FORMATS[f].lossy]
LOSSY = [f for f in SUPPORTED if codecs.FORMATS[f].lossy]


def _signal() -> np.ndarray:
    """2.5 s: a chirp 200 -> 2200 Hz at -6 dBFS, with a quarter second of silence in it."""
    t = np.arange(int(RATE * 2.5)) / RATE
    x = 0.5 * np.sin(2 * np.pi * (200 * t + 400 * t**2))
    x[RATE : RATE + RATE // 4] = 0.0
    return x.astype(np.float32)


SIGNAL = _signal()
# Uneven sentence-sized pieces, one of a single sample.
CUTS = [0, 5000, 5001, 20000, 40000, len(SIGNAL)]


def _stream(fmt: str, x: np.ndarray = SIGNAL, cuts: list[int] = CUTS) -> tuple[bytes, codecs.StreamEncoder]:
    enc = codecs.StreamEncoder(fmt, RATE)
    parts = [enc.header()] + [enc.encode_chunk(x[a:b]) for a, b in itertools.pairwise(cuts)] + [enc.finish()]
    return b"".join(parts), enc


def _decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Decoded samples (int16 for lossless formats, float for lossy) and the sample rate."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2"), RATE
    dtype = "float64" if codecs.FORMATS[fmt].lossy else "int16"
    with soundfile.SoundFile(io.BytesIO(data)) as f:
        if f.frames < 2**62:
            return f.read(dtype=dtype), f.samplerate
        # Unknown length (a streamed FLAC): soundfile's read() seeks after reading, which fails on such
        # a file, so call libsndfile's reader directly until it runs dry.
        parts, block = [], np.empty(4096, dtype=np.int16)
        ptr = soundfile._ffi.cast("short*", block.ctypes.data)
        while (n := soundfile._snd.sf_readf_short(f._file, ptr, len(block))) > 0:
            parts.append(block[:n].copy())
        return np.concatenate(parts), f.samplerate


def _reference(fmt: str) -> np.ndarray:
    """The input as the encoder sees it: resampled to the codec's rate if it needs one."""
    out_rate = codecs.output_sample_rate(fmt, RATE)
    return SIGNAL if out_rate == RATE else resample.Resampler(RATE, out_rate).resample(SIGNAL)


def test_this_build_supports_the_openai_formats():
    # The bundled libsndfile (1.2.x) has LAME/mpg123 and libopus; if a build lacks one it must say so.
    assert SUPPORTED[:3] == ["wav", "pcm", "flac"]
    assert set(SUPPORTED) <= set(codecs.FORMATS)
    assert {f.media_type for f in codecs.FORMATS.values()} == {
        "audio/wav",
        "audio/pcm",
        "audio/flac",
        "audio/mpeg",
        "audio/ogg",
    }


@pytest.mark.parametrize("fmt", LOSSLESS)
def test_lossless_whole_file_round_trips_exactly(fmt):
    decoded, rate = _decode(codecs.encode(SIGNAL, RATE, fmt), fmt)
    assert rate == RATE
    np.testing.assert_array_equal(decoded, codecs.to_pcm16(SIGNAL))


@pytest.mark.parametrize("fmt", LOSSY)
def test_lossy_whole_file_round_trips_closely(fmt):
    ref = _reference(fmt)
    decoded, rate = _decode(codecs.encode(SIGNAL, RATE, fmt), fmt)
    assert rate == codecs.output_sample_rate(fmt, RATE)
    # libsndfile trims MP3 encoder delay/padding (LAME tag) and Opus pre-skip: lengths are exact.
    assert len(decoded) == len(ref)
    assert np.corrcoef(decoded, ref)[0, 1] > 0.9


@pytest.mark.parametrize("fmt", SUPPORTED)
def test_streamed_chunks_decode_to_the_whole_file(fmt):
    whole = codecs.encode(SIGNAL, RATE, fmt)
    streamed, enc = _stream(fmt)
    assert enc.output_rate == codecs.output_sample_rate(fmt, RATE)
    want, want_rate = _decode(whole, fmt)
    got, got_rate = _decode(streamed, fmt)
    assert got_rate == want_rate
    if fmt == "mp3":
        # The stream has no LAME gapless info: it starts with the (silent) placeholder tag frame and the
        # encoder delay, and ends with padding. After that lead the decoded audio is the same.
        lag = int(np.argmax(np.correlate(got[: 8000 + 2400], want[:8000], mode="valid")))
        assert np.max(np.abs(got[:lag])) < 0.01
        np.testing.assert_allclose(got[lag : lag + len(want)], want, atol=1e-3)
        assert 0 <= len(got) - lag - len(want) < 1152
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", [f for f in ("flac", "mp3") if f in SUPPORTED])
def test_stream_differs_from_file_only_where_the_writer_patched_its_header(fmt):
    streamed, enc = _stream(fmt)
    assert enc.rewrites, "libsndfile seeks back to fill in this format's header on close"
    patched = bytearray(streamed)
    for offset, data in enc.rewrites:
        assert offset + len(data) <= 512  # header fields only, never audio frames
        patched[offset : offset + len(data)] = data
    assert bytes(patched) == codecs.encode(SIGNAL, RATE, fmt)


def test_streaming_sends_audio_as_it_arrives():
    # Bytes come back chunk by chunk, not all at finish (each codec holds back only a frame or page).
    x = np.tile(SIGNAL, 2)
    cuts = [0, RATE, 2 * RATE, 3 * RATE, 4 * RATE, len(x)]
    for fmt in SUPPORTED:
        enc = codecs.StreamEncoder(fmt, RATE)
        enc.header()
        sizes = [len(enc.encode_chunk(x[a:b])) for a, b in itertools.pairwise(cuts)]
        enc.close()
        assert all(s > 0 for s in sizes[1:]), (fmt, sizes)


def test_wav_stream_header_says_unknown_length():
    streamed, _ = _stream("wav")
    header = streamed[:44]
    assert header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt " and header[36:40] == b"data"
    assert struct.unpack("<I", header[4:8])[0] == codecs.WAV_UNKNOWN_SIZE
    assert struct.unpack("<I", header[40:44])[0] == codecs.WAV_UNKNOWN_SIZE
    # Same fmt chunk libsndfile writes for the whole file.
    assert header[12:36] == codecs.encode(SIGNAL, RATE, "wav")[12:36]
    with wave.open(io.BytesIO(streamed)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        assert w.getnframes() == codecs.WAV_UNKNOWN_SIZE // 2
        frames = w.readframes(w.getnframes())
    np.testing.assert_array_equal(np.frombuffer(frames, dtype="<i2"), codecs.to_pcm16(SIGNAL))
    # The header goes out once even if the caller never asks for it.
    enc = codecs.StreamEncoder("wav", RATE)
    assert enc.encode_chunk(SIGNAL[:10])[:44] == header
    assert len(enc.encode_chunk(SIGNAL[10:20])) == 20


def test_pcm_is_raw_int16_little_endian():
    data = codecs.encode(SIGNAL, RATE, "pcm")
    assert len(data) == 2 * len(SIGNAL)
    assert data[:2] == struct.pack("<h", int(codecs.to_pcm16(SIGNAL)[0]))
    streamed, enc = _stream("pcm")
    assert streamed == data and enc.media_type == "audio/pcm"


def test_floats_clip_instead_of_wrapping():
    x = np.array([0.0, 0.5, 1.0, 1.5, 40.0, -1.0, -1.5, np.inf, -np.inf, np.nan], dtype=np.float32)
    np.testing.assert_array_equal(
        codecs.to_pcm16(x), [0, 16384, 32767, 32767, 32767, -32767, -32767, 32767, -32767, 0]
    )
    loud = np.sin(np.linspace(0, 20 * np.pi, 2000)) * 3.0  # far past full scale
    decoded, _ = _decode(codecs.encode(loud, RATE, "wav"), "wav")
    assert np.all(np.sign(decoded[np.abs(loud) > 0.01]) == np.sign(loud[np.abs(loud) > 0.01]))
    assert decoded.max() == 32767 and decoded.min() == -32767


@pytest.mark.parametrize("fmt", ["aac", "MP3", "ogg", ""])
def test_unknown_format_is_a_bad_request_listing_the_supported_ones(fmt):
    for call in (lambda: codecs.encode(SIGNAL, RATE, fmt), lambda: codecs.StreamEncoder(fmt, RATE)):
        with pytest.raises(BadRequest) as err:
            call()
        assert repr(fmt) in err.value.message
        assert "supported: " + ", ".join(SUPPORTED) in err.value.message
        assert err.value.http_status == 400


def test_format_missing_from_the_library_is_refused(monkeypatch):
    monkeypatch.setattr(codecs, "supported_formats", lambda: ["wav", "pcm", "flac"])
    with pytest.raises(BadRequest, match=r"'opus' is not available .*supported: wav, pcm, flac$"):
        codecs.encode(SIGNAL, RATE, "opus")


def test_opus_resamples_to_a_rate_it_accepts():
    assert codecs.output_sample_rate("opus", 22050) == 24000
    assert codecs.output_sample_rate("opus", 44100) == 48000
    assert codecs.output_sample_rate("opus", 16000) == 16000
    assert codecs.output_sample_rate("mp3", 22050) == 22050
    assert codecs.output_sample_rate("flac", 22050) == 22050


def test_resampler_is_accurate_and_chunking_does_not_change_it():
    t = np.arange(RATE) / RATE
    x = np.sin(2 * np.pi * 1000 * t)
    y = resample.Resampler(RATE, 24000).resample(x)
    assert len(y) == 24000
    ideal = np.sin(2 * np.pi * 1000 * np.arange(len(y)) / 24000)
    inner = slice(100, -100)  # the ends see silence before and after the input
    snr = 10 * np.log10(np.mean(ideal[inner] ** 2) / np.mean((y - ideal)[inner] ** 2))
    assert snr > 80
    r = resample.Resampler(RATE, 24000)
    cuts = [0, 1, 30, 4000, 4001, len(x)]
    pieces = [r.process(x[a:b]) for a, b in itertools.pairwise(cuts)] + [r.flush()]
    np.testing.assert_array_equal(np.concatenate(pieces), y)


def test_empty_audio():
    assert codecs.encode(np.zeros(0, np.float32), RATE, "pcm") == b""
    decoded, _ = _decode(codecs.encode(np.zeros(0, np.float32), RATE, "wav"), "wav")
    assert len(decoded) == 0
    if "flac" in SUPPORTED:
        with pytest.raises(ValueError, match="zero samples"):
            codecs.encode(np.zeros(0, np.float32), RATE, "flac")
