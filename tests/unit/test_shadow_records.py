"""Shadow records in one process: the fingerprint, the recorder's batching and its full queue, the
revision's sources, and `tts-ops compare` on synthetic record files (verdicts and exit codes).

The sinks, a real predictor's records and Envoy mirroring are in tests/system/test_shadow.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

# Triton's copy of the v2 protos, as the other test modules load: KServe's and Triton's define the same
# `inference.*` symbols and cannot share one process.
from predictor.audio import fingerprint
from predictor.config import load_settings
from predictor.observability import metrics
from predictor.shadow import recorder as recording
from testing.polling import wait_until
from testing.records import SR, voiced, write_jsonl
from testing.records import shadow_record as record
from tts_ops import cli as ops_cli

# --- helpers ---------------------------------------------------------------------------------
N_SYNTH = 40
LATENCIES = np.linspace(0.4, 0.6, N_SYNTH)


@pytest.fixture(scope="module")
def stable_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("records") / "stable.jsonl"
    return write_jsonl(
        path, [record(f"r{i}", "stable", voiced(i), latency_s=LATENCIES[i]) for i in range(N_SYNTH)]
    )


def canary(tmp_path: Path, make) -> Path:
    """Canary records in a directory of two batch files, as a sink writes them."""
    records = [make(i) for i in range(N_SYNTH)]
    records = [r for r in records if r is not None]
    write_jsonl(tmp_path / "canary" / "a.jsonl", records[: len(records) // 2])
    write_jsonl(tmp_path / "canary" / "b.jsonl", records[len(records) // 2 :])
    return tmp_path / "canary"


def run_compare(capsys, *args: str) -> tuple[int, str, str]:
    code = ops_cli.main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- the fingerprint -------------------------------------------------------------------------
def test_fingerprint_has_a_fixed_shape_whatever_the_audio_length():
    short = fingerprint.fingerprint(voiced(0, seconds=0.01), SR)  # shorter than one analysis window
    long = fingerprint.fingerprint(voiced(0, seconds=12.0), SR)

    assert short.shape == long.shape == (fingerprint.FRAMES, fingerprint.N_CEPS)
    assert np.isfinite(short).all() and np.isfinite(long).all()


def test_spectral_distance_is_zero_for_the_same_audio_and_grows_with_distortion():
    clean = voiced(1)
    noise = np.random.default_rng(0).normal(0, 1, len(clean)).astype(np.float32)
    fp = fingerprint.fingerprint(clean, SR)

    same = fingerprint.mel_cepstral_distortion(fp, fingerprint.fingerprint(clean.copy(), SR))
    louder = fingerprint.mel_cepstral_distortion(fp, fingerprint.fingerprint(2 * clean, SR))
    slight = fingerprint.mel_cepstral_distortion(fp, fingerprint.fingerprint(clean + 0.002 * noise, SR))
    heavy = fingerprint.mel_cepstral_distortion(fp, fingerprint.fingerprint(clean + 0.05 * noise, SR))

    assert same == 0.0
    assert louder < 0.01, "overall level (c0) is not part of the distance"
    assert 0 < slight < heavy


# --- the recorder, in-process ----------------------------------------------------------------
class ListSink:
    def __init__(self, gate: threading.Event | None = None):
        self.batches: list[list[dict]] = []
        self.gate = gate

    def write(self, body: bytes) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append([json.loads(line) for line in body.splitlines()])


def _capture(text: str) -> recording.Capture:
    c = recording.Capture()
    c.add([text], [voiced(len(text))], SR)
    return c


def test_recorder_writes_full_batches_then_the_rest_when_they_are_old_enough():
    sink = ListSink()
    recorder = recording.Recorder(sink, "rev", batch_records=3, flush_s=0.3, queue_size=100)

    for i in range(7):
        recorder.submit(f"id{i}", "/v2/models/{model_name}/infer", 200, 0.1, _capture(f"text {i}"))
    with contextlib.suppress(TimeoutError):  # the assertions below say what went missing
        wait_until(lambda: sum(map(len, sink.batches)) >= 7, 10, 0.02, "seven records written")
    recorder.close()

    assert [len(b) for b in sink.batches] == [3, 3, 1]
    first = sink.batches[0][0]
    assert first["id"] == "id0" and first["revision"] == "rev" and first["status"] == 200
    assert first["text_sha256"] == recording.text_sha256(["text 0"])
    assert np.asarray(first["mcep"]).shape == (fingerprint.FRAMES, fingerprint.N_CEPS)


def test_full_queue_drops_records_instead_of_slowing_the_request():
    gate = threading.Event()  # the sink hangs until released, as a stalled S3 would
    recorder = recording.Recorder(ListSink(gate), "rev", batch_records=1, flush_s=60, queue_size=2)
    dropped = metrics.SHADOW_RECORDS.labels("dropped")
    before = dropped._value.get()

    started = time.perf_counter()
    for i in range(50):
        recorder.submit(f"id{i}", "/v1/models/{model_name}:predict", 200, 0.1, None)
    elapsed = time.perf_counter() - started
    gate.set()
    recorder.close()

    assert elapsed < 0.5
    assert dropped._value.get() - before >= 40  # one in the sink, two queued, the rest dropped


def test_revision_comes_from_revision_then_knatives_k_revision_then_local():
    assert load_settings(revision="", k_revision="").revision_name == "local"
    assert load_settings(revision="", k_revision="tts-00002").revision_name == "tts-00002"
    assert load_settings(revision="canary", k_revision="tts-00002").revision_name == "canary"


# --- compare on synthetic records ------------------------------------------------------------
def test_identical_canary_passes_with_exit_0(capsys, stable_file, tmp_path):
    same = canary(tmp_path, lambda i: record(f"r{i}", "canary", voiced(i), latency_s=LATENCIES[i]))

    code, out, _ = run_compare(capsys, "--stable", str(stable_file), "--canary", str(same))

    assert code == 0, out
    assert "PASS" in out and "match rate       100.0%" in out


def test_slower_canary_fails_naming_latency(capsys, stable_file, tmp_path):
    slow = canary(tmp_path, lambda i: record(f"r{i}", "canary", voiced(i), latency_s=LATENCIES[i] * 1.5))

    code, out, _ = run_compare(capsys, "--stable", str(stable_file), "--canary", str(slow))

    assert code == 1
    assert "latency p50" in out and "latency p99" in out
    assert "duration" not in out.split("FAIL", 1)[1] and "spectral" not in out.split("FAIL", 1)[1]


def test_longer_audio_fails_naming_duration(capsys, stable_file, tmp_path):
    longer = canary(
        tmp_path, lambda i: record(f"r{i}", "canary", voiced(i, seconds=1.5 * 1.2), latency_s=LATENCIES[i])
    )

    code, out, _ = run_compare(capsys, "--stable", str(stable_file), "--canary", str(longer))

    assert code == 1
    assert "duration ratio 1.200 outside 1 ± 0.05" in out


def test_distorted_audio_fails_naming_spectral_distance(capsys, stable_file, tmp_path):
    rng = np.random.default_rng(7)

    def noisy(i: int) -> dict:
        audio = voiced(i)
        return record(
            f"r{i}",
            "canary",
            audio + rng.normal(0, 0.05, len(audio)).astype(np.float32),
            latency_s=LATENCIES[i],
        )

    code, out, _ = run_compare(capsys, "--stable", str(stable_file), "--canary", str(canary(tmp_path, noisy)))

    assert code == 1
    assert "spectral distance p50" in out
    assert "duration ratio" not in out.split("FAIL", 1)[1]


def test_canary_that_missed_requests_fails_naming_match_rate(capsys, stable_file, tmp_path):
    sparse = canary(
        tmp_path, lambda i: record(f"r{i}", "canary", voiced(i), latency_s=LATENCIES[i]) if i % 4 else None
    )

    code, out, _ = run_compare(capsys, "--stable", str(stable_file), "--canary", str(sparse))

    assert code == 1
    assert "match rate 75.0% < 95.0%" in out


def test_canary_errors_fail_naming_error_rate(capsys, stable_file, tmp_path):
    failing = canary(
        tmp_path,
        lambda i: record(f"r{i}", "canary", voiced(i), latency_s=LATENCIES[i], status=503 if i < 4 else 200),
    )

    code, out, _ = run_compare(capsys, "--stable", str(stable_file), "--canary", str(failing), "--json")

    assert code == 1
    summary = json.loads(out)
    assert summary["verdict"] == "FAIL" and summary["error_rate"] == [0.0, 0.1]
    assert any(r.startswith("error rate 10.0% vs 0.0%") for r in summary["reasons"])


def test_matched_ids_with_different_texts_fail_saying_ids_are_not_unique(capsys, stable_file, tmp_path):
    def other_text(i: int) -> dict:
        r = record(f"r{i}", "canary", voiced(i), latency_s=LATENCIES[i])
        return {**r, "text_sha256": recording.text_sha256([f"something else {i}"])} if i == 3 else r

    code, out, _ = run_compare(
        capsys, "--stable", str(stable_file), "--canary", str(canary(tmp_path, other_text))
    )

    assert code == 1
    assert "1 matched requests carry different texts" in out


def test_png_with_latency_cdfs_and_distance_histogram_is_written_whole(capsys, stable_file, tmp_path):
    same = canary(tmp_path, lambda i: record(f"r{i}", "canary", voiced(i), latency_s=LATENCIES[i]))
    png = tmp_path / "plots" / "verdict.png"

    code, out, _ = run_compare(capsys, "--stable", str(stable_file), "--canary", str(same), "--png", str(png))

    assert code == 0, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert [p.name for p in png.parent.iterdir()] == ["verdict.png"], "a temporary file was left behind"


def test_missing_canary_argument_is_a_usage_error_exit_2(capsys, stable_file):
    with pytest.raises(SystemExit) as exc:
        ops_cli.main(["compare", "--stable", str(stable_file)])

    assert exc.value.code == 2
    assert "--canary" in capsys.readouterr().err


def test_records_location_that_does_not_exist_exits_2_naming_it(capsys, stable_file, tmp_path):
    code, _, err = run_compare(capsys, "--stable", str(stable_file), "--canary", str(tmp_path / "nowhere"))

    assert code == 2
    assert "nowhere: no such file or directory" in err


def test_no_overlapping_request_ids_exits_2_saying_so(capsys, stable_file, tmp_path):
    other = canary(tmp_path, lambda i: record(f"other-{i}", "canary", voiced(i)))

    code, _, err = run_compare(capsys, "--stable", str(stable_file), "--canary", str(other))

    assert code == 2
    assert "no request id appears on both sides" in err and "x-request-id" in err


def test_malformed_record_exits_2_naming_file_and_line(capsys, stable_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(record("r0", "canary", voiced(0))) + "\n{not json\n")

    code, _, err = run_compare(capsys, "--stable", str(stable_file), "--canary", str(bad))

    assert code == 2
    assert f"{bad}:2 is not JSON" in err


def test_line_without_the_record_fields_exits_2_naming_it(capsys, stable_file, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "r0", "status": "200"}])

    code, _, err = run_compare(capsys, "--stable", str(stable_file), "--canary", str(bad))

    assert code == 2
    assert f"{bad}:1 is not a shadow record" in err
