"""MOS estimates on the real voice's speech: degraded copies score lower than clean, shadow records
carry (or skip) scores, and a real predictor writes them into its sampled records.

The estimator against speechmos's reference, bad input and compare's MOS verdicts: tests/unit/test_quality.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from predictor.audio import quality
from predictor.engine.base import SynthesisParams
from predictor.observability import metrics
from predictor.shadow import recorder as recording
from testing import degrade
from testing.bodies import v2_request
from testing.polling import wait_until

SR16 = quality.SAMPLE_RATE


@pytest.fixture(scope="module")
def estimator() -> quality.Estimator:
    return quality.Estimator(threads=1)


# --- real speech, clean and degraded ----------------------------------------------------------
@pytest.fixture(scope="module")
def speech(voice_dir: Path) -> tuple[list[np.ndarray], int]:
    """Two sentences of the default voice, deterministic (onnx engine, no noise)."""
    from predictor.config import load_settings
    from predictor.engine.factory import create

    engine = create(load_settings(engine="onnx", cpu_threads=1))
    engine.load(voice_dir)
    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "At three o'clock on the twelfth of May, the canary received ten percent of the traffic.",
    ]
    return engine.synthesize(texts, SynthesisParams(noise_scale=0.0, noise_w=0.0)), engine.sample_rate


# Which estimate each degradation lowers, as measured on these sentences (docs/canary.md, Quality (MOS)):
# noise lowers both; band limits lower P.808 and leave OVRL; clipping lowers OVRL.
DEGRADATIONS = {
    "white noise at 10 dB SNR": (lambda x, sr: degrade.add_noise(x, 10), ("p808", "ovrl")),
    "low-pass at 2 kHz": (lambda x, sr: degrade.low_pass(x, sr, 2000), ("p808",)),
    "8 kHz telephone band": (lambda x, sr: degrade.narrowband(x, sr, 8000), ("p808",)),
    "clipped 12 dB over full scale": (lambda x, sr: degrade.clip(x, 12), ("ovrl",)),
}


@pytest.mark.parametrize("name", list(DEGRADATIONS))
def test_degraded_speech_scores_lower_than_clean(estimator, speech, name):
    degrade_fn, lowered = DEGRADATIONS[name]
    clips, sr = speech

    for clip in clips:
        clean = estimator.estimate(clip, sr)
        worse = estimator.estimate(degrade_fn(clip, sr), sr)

        assert clean is not None and worse is not None
        for field in lowered:
            assert getattr(worse, field) < getattr(clean, field) - 0.1, (
                f"{name}: {field} {getattr(worse, field):.2f} vs clean {getattr(clean, field):.2f}"
            )


# --- shadow records -------------------------------------------------------------------------------
class ListSink:
    def __init__(self, gate: threading.Event | None = None):
        self.records: list[dict] = []
        self.gate = gate

    def write(self, body: bytes) -> None:
        if self.gate is not None:
            self.gate.wait(30)
        self.records += [json.loads(line) for line in body.splitlines()]


def _capture(audio: np.ndarray, sr: int, text: str = "t") -> recording.Capture:
    c = recording.Capture()
    c.add([text], [audio], sr)
    return c


def test_sampled_records_carry_mos_unscorable_and_failed_ones_carry_none(speech):
    clips, sr = speech
    sink = ListSink()
    rec = recording.Recorder(sink, "rev", batch_records=100, flush_s=0.2, queue_size=16, mos_sample=1.0)
    scored = metrics.SHADOW_MOS.labels("scored")
    unscored = metrics.SHADOW_MOS.labels("unscored")
    before = scored._value.get(), unscored._value.get()

    rec.submit("speech", "/v2/models/{model_name}/infer", 200, 0.3, _capture(clips[0], sr))
    rec.submit("short", "/v2/models/{model_name}/infer", 200, 0.1, _capture(clips[0][: sr // 2], sr))
    rec.submit("failed", "/v2/models/{model_name}/infer", 503, 0.1, _capture(clips[1], sr))
    rec.submit("no-audio", "/v2/models/{model_name}/infer", 400, 0.1, None)
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: len(sink.records) >= 4, 60, 0.05, "four records")
    rec.close()

    by_id = {r["id"]: r for r in sink.records}
    assert 1 < by_id["speech"]["mos_p808"] <= 5 and 1 < by_id["speech"]["mos_ovrl"] <= 5
    assert by_id["speech"]["mos_sig"] is not None and by_id["speech"]["mos_bak"] is not None
    for rid in ("short", "failed", "no-audio"):
        assert all(by_id[rid][f] is None for f in recording.MOS_FIELDS), rid
    assert (scored._value.get(), unscored._value.get()) == (before[0] + 1, before[1] + 1)


def test_mos_is_skipped_not_queued_when_the_records_thread_is_behind(speech):
    clips, sr = speech
    gate = threading.Event()  # the sink stalls the thread until released, as a slow S3 would
    sink = ListSink(gate)
    rec = recording.Recorder(sink, "rev", batch_records=1, flush_s=60, queue_size=8, mos_sample=1.0)
    behind = metrics.SHADOW_MOS.labels("behind")
    before = behind._value.get()

    rec.submit("r0", "/v1/models/{model_name}:predict", 200, 0.1, _capture(clips[0], sr))
    wait_until(lambda: rec._queue.qsize() == 0, 60, 0.02, "the thread took the first record")
    for i in range(1, 7):  # 6 queued > a quarter of 8: behind
        rec.submit(f"r{i}", "/v1/models/{model_name}:predict", 200, 0.1, _capture(clips[0], sr))
    gate.set()
    rec.close(timeout_s=120)

    by_id = {r["id"]: r for r in sink.records}
    assert len(by_id) == 7, "every record is written, scored or not"
    skipped = [i for i in by_id if by_id[i]["mos_p808"] is None]
    assert len(skipped) >= 3 and "r1" in skipped
    assert behind._value.get() - before == len(skipped)


def test_predictor_writes_mos_into_sampled_records(start_predictor, tmp_path):
    sink = tmp_path / "records"
    p = start_predictor(
        SHADOW_SINK=str(sink), SHADOW_FLUSH_S="0.2", SHADOW_MOS_SAMPLE="1", REVISION="rev-mos"
    )
    text = "A sentence long enough to be scored by the estimator, about three seconds of speech."

    r = p.post("/v2/models/tts/infer", json=v2_request(text), headers={"X-Request-Id": "mos-1"})

    assert r.status_code == 200

    def record() -> dict | None:
        for f in sink.rglob("*.jsonl"):
            for line in f.read_text().splitlines():
                if json.loads(line)["id"] == "mos-1":
                    return json.loads(line)
        return None

    found = p.wait_for(record, 120, "the request's record", interval=0.2)
    assert 1 < found["mos_p808"] <= 5 and 1 < found["mos_ovrl"] <= 5
    assert p.metric("tts_shadow_mos_total", outcome="scored") >= 1
