"""MOS estimates (DNSMOS): the estimator against speechmos's reference, on degraded speech and bad input;
shadow records carrying them; compare's MOS report and verdict."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from predictor import cli
from predictor.audio import quality
from predictor.engine.base import SynthesisParams
from predictor.observability import metrics
from predictor.shadow import recorder as recording
from testing import degrade
from testing.bodies import v2_request
from testing.polling import wait_until
from testing.records import shadow_record, voiced, write_jsonl

SR16 = quality.SAMPLE_RATE


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """A fixed 16 kHz clip (harmonic glide, syllable envelope, a little noise): numpy's PCG64 stream
    is stable across versions, so the reference scores below stay valid."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR16)) / SR16
    f0 = 110 + 40 * rng.random() + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR16
    tone = sum(np.sin(k * phase) / k for k in range(1, 20))
    envelope = np.sin(2 * np.pi * (2 + rng.random()) * t) ** 2
    noise = 0.01 * rng.standard_normal(len(t))
    return (0.15 * tone * envelope + noise).astype(np.float32)


# speechmos 0.0.1.1 `dnsmos.run(clip, 16000)` (with librosa 0.9.1, its stated prerequisite, in a
# separate virtualenv) on the clips above: p808, sig, bak, ovrl. The 9.01 s row is the 12.5 s clip's
# first segment alone, which is what our estimator scores by default.
REFERENCE = {
    (3.0, 1, None): (2.3714640140533447, 3.1654891812790935, 3.0153114421448133, 2.2991685842385405),
    (12.5, 2, None): (2.406402587890625, 3.0844425224299727, 1.92895753787945, 1.7612021922631935),
    (12.5, 2, 1): (2.3899495601654053, 3.0431463337129547, 1.89599630434233, 1.7191712983466596),
}


@pytest.fixture(scope="module")
def estimator() -> quality.Estimator:
    return quality.Estimator(threads=1)


@pytest.mark.parametrize(("seconds", "seed", "max_segments"), list(REFERENCE))
def test_scores_equal_speechmos_on_the_same_clip(seconds, seed, max_segments):
    mos = quality.Estimator(max_segments=max_segments).estimate(speechlike(seconds, seed), SR16)

    assert mos is not None
    got = (mos.p808, mos.sig, mos.bak, mos.ovrl)
    np.testing.assert_allclose(got, REFERENCE[(seconds, seed, max_segments)], atol=1e-4)


def test_long_clip_costs_one_segment_by_default_and_every_second_with_all(estimator):
    clip = speechlike(12.5, 2)

    assert estimator.estimate(clip, SR16).segments == 1
    # speechmos: int(floor(12.5) - 9.01) + 1 segments, one a second
    assert quality.Estimator(max_segments=None).estimate(clip, SR16).segments == 3


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


# --- bad input ----------------------------------------------------------------------------------
def _nan_in(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[100] = np.nan
    return x


def _inf_in(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[-1] = np.inf
    return x


@pytest.mark.parametrize(
    ("clip", "reason"),
    [
        (speechlike(0.5, 3), "too_short"),
        (np.zeros(3 * SR16, dtype=np.float32), "silence"),
        (speechlike(3.0, 3) * 1e-4, "silence"),
        (_nan_in(speechlike(3.0, 3)), "non_finite"),
        (_inf_in(speechlike(3.0, 3)), "non_finite"),
        (np.zeros(0, dtype=np.float32), "too_short"),
    ],
    ids=["half a second", "zeros", "-80 dBFS", "a NaN", "an inf", "empty"],
)
def test_clip_that_cannot_be_scored_gets_no_score_and_is_counted(estimator, clip, reason):
    counter = metrics.MOS_UNSCORED.labels(reason)
    before = counter._value.get()

    assert estimator.estimate(clip, SR16) is None
    assert counter._value.get() == before + 1


def test_samples_beyond_full_scale_are_clipped_not_refused(estimator):
    loud = speechlike(3.0, 4) * 6.0  # peaks ~1.7

    mos = estimator.estimate(loud, SR16)

    assert mos is not None and 1.0 <= mos.p808 <= 5.0


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


def test_mos_sample_is_the_same_ids_in_every_revision_and_about_the_share():
    ids = [f"req-{i}" for i in range(20_000)]

    first = [recording.mos_sampled(i, 0.05) for i in ids]
    again = [recording.mos_sampled(i, 0.05) for i in ids]

    assert first == again
    assert 0.04 < sum(first) / len(ids) < 0.06
    assert not any(recording.mos_sampled(i, 0.0) for i in ids[:1000])
    assert all(recording.mos_sampled(i, 1.0) for i in ids[:1000])


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


def test_mos_sample_without_the_models_is_refused_at_start(monkeypatch, tmp_path):
    from predictor.config import ConfigError, load_settings
    from predictor.shadow import recorder as records

    def missing() -> tuple[Path, Path]:
        raise quality.QualityUnavailable("MOS estimates need the DNSMOS models from the speechmos package")

    monkeypatch.setattr(quality, "model_files", missing)
    with pytest.raises(ConfigError, match="SHADOW_MOS_SAMPLE"):
        records.from_settings(load_settings(shadow_sink=str(tmp_path), shadow_mos_sample=0.05))
    assert records.from_settings(load_settings(shadow_sink=str(tmp_path), shadow_mos_sample=0)) is not None


# --- compare ----------------------------------------------------------------------------------
N_PAIRS = 30


def write_sides(
    tmp_path: Path, canary_p808_shift: float, canary_ovrl_shift: float = 0.0, scored: int = N_PAIRS
):
    """Stable and canary JSONL files; the first `scored` pairs carry MOS, the canary's shifted."""
    rng = np.random.default_rng(7)
    base = 3.6 + 0.3 * rng.standard_normal(N_PAIRS)  # texts differ in difficulty...
    jitter = 0.05 * rng.standard_normal(N_PAIRS)  # ...far more than two renditions of one text
    stable, canary = [], []
    for i in range(N_PAIRS):
        has = i < scored
        s808, sov = (float(base[i]), float(base[i] - 0.7)) if has else (None, None)
        c808 = float(base[i] + jitter[i] + canary_p808_shift) if has else None
        cov = float(base[i] - 0.7 - jitter[i] + canary_ovrl_shift) if has else None
        audio = voiced(i)
        stable.append(shadow_record(f"r{i}", "stable", audio, mos={"p808": s808, "ovrl": sov}))
        canary.append(shadow_record(f"r{i}", "canary", audio, mos={"p808": c808, "ovrl": cov}))
    return (
        str(write_jsonl(tmp_path / "stable.jsonl", stable)),
        str(write_jsonl(tmp_path / "canary.jsonl", canary)),
    )


def run_compare(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_reports_mos_of_both_sides_with_intervals_and_the_paired_difference(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=-0.02)

    code, out, _ = run_compare(capsys, "--stable", stable, "--canary", canary, "--max-mos-drop", "0.1")

    assert code == 0, out
    p808 = next(line for line in out.splitlines() if line.startswith("MOS P.808"))
    assert "±" in p808 and "paired -0.0" in p808 and f"{N_PAIRS} pairs" in p808
    assert any(line.startswith("MOS P.835 OVRL") for line in out.splitlines())


def test_paired_difference_is_tighter_than_either_sides_interval(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=-0.02)

    code, out, _ = run_compare(capsys, "--stable", stable, "--canary", canary, "--json")

    summary = json.loads(out)["mos"]["mos_p808"]
    assert code == 0
    assert summary["pairs"] == N_PAIRS
    assert summary["diff_ci"] < summary["stable_ci"] / 3 and summary["diff_ci"] < summary["canary_ci"] / 3
    assert summary["diff_mean"] == pytest.approx(summary["canary_mean"] - summary["stable_mean"])


def test_canary_whose_p808_mos_dropped_fails_naming_it(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=-0.3)

    code, out, _ = run_compare(capsys, "--stable", stable, "--canary", canary, "--max-mos-drop", "0.1")

    assert code == 1
    assert "FAIL" in out and "MOS P.808 dropped 0.3" in out and "OVRL dropped" not in out


def test_canary_whose_ovrl_dropped_fails_even_with_p808_unchanged(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=0.0, canary_ovrl_shift=-0.25)

    code, out, _ = run_compare(capsys, "--stable", stable, "--canary", canary, "--max-mos-drop", "0.1")

    assert code == 1 and "MOS P.835 OVRL dropped 0.2" in out


def test_mos_drop_is_not_judged_unless_asked(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=-0.5)

    code, out, _ = run_compare(capsys, "--stable", stable, "--canary", canary)

    assert code == 0 and "MOS P.808" in out


def test_records_without_scores_compare_and_say_none_was_scored(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=0.0, scored=0)
    for path in (stable, canary):  # records from before MOS existed: no mos_* keys at all
        lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
        Path(path).write_text(
            "".join(
                json.dumps({k: v for k, v in r.items() if not k.startswith("mos_")}) + "\n" for r in lines
            )
        )

    code, out, _ = run_compare(capsys, "--stable", stable, "--canary", canary)

    assert code == 0
    assert "MOS              - (no request scored on both sides" in out


def test_mos_threshold_with_too_few_scored_pairs_exits_2_with_the_count(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=-0.5, scored=12)

    code, out, err = run_compare(capsys, "--stable", stable, "--canary", canary, "--max-mos-drop", "0.1")

    assert code == 2 and out == ""
    assert "at least 20 requests scored on both sides; 12 are" in err


def test_png_shows_the_mos_panel(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=-0.3)
    png = tmp_path / "verdict.png"

    code, _, _ = run_compare(capsys, "--stable", stable, "--canary", canary, "--png", str(png))

    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    width = matplotlib.image.imread(png).shape[1]
    assert width == 1600, "three panels: latency, distance, MOS"


def test_html_page_shows_mos_and_its_threshold(capsys, tmp_path):
    stable, canary = write_sides(tmp_path, canary_p808_shift=-0.3)
    page = tmp_path / "verdict.html"

    code, _, _ = run_compare(
        capsys, "--stable", stable, "--canary", canary, "--max-mos-drop", "0.1", "--html", str(page)
    )

    text = page.read_text()
    assert code == 1
    assert "MOS P.808 (mean ± 95 % CI)" in text and "MOS P.835 OVRL (paired)" in text
    assert "--max-mos-drop" in text and "MOS P.808 dropped 0.3" in text
