"""MOS estimates (DNSMOS) in one process: the estimator against speechmos's reference values, on
bad input; the MOS sample of shadow records; compare's MOS report and verdict.

Real speech, clean and degraded, and a real predictor's records: tests/system/test_quality_speech.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.audio import quality
from predictor.observability import metrics
from predictor.shadow import recorder as recording
from testing import mos_reference
from testing.records import shadow_record, voiced, write_jsonl
from tts_ops import cli as ops_cli

SR16 = quality.SAMPLE_RATE
speechlike = mos_reference.speechlike


# speechmos's own `dnsmos.run(clip, 16000)` on testing/mos_reference.py's clips (p808, sig, bak, ovrl),
# as `make mos-reference` last recorded them in testing/dnsmos_reference.json.
REFERENCE = mos_reference.scores()


@pytest.fixture(scope="module")
def estimator() -> quality.Estimator:
    return quality.Estimator(threads=1)


@pytest.mark.parametrize(("seconds", "seed", "max_segments"), list(REFERENCE))
def test_scores_equal_speechmos_on_the_same_clip(seconds, seed, max_segments):
    mos = quality.Estimator(max_segments=max_segments).estimate(speechlike(seconds, seed), SR16)

    assert mos is not None
    got = (mos.p808, mos.sig, mos.bak, mos.ovrl)
    np.testing.assert_allclose(got, REFERENCE[(seconds, seed, max_segments)], atol=1e-4)


@pytest.mark.parametrize(
    "recorded", mos_reference.load()["clips"], ids=lambda c: f"{c['seconds']}s-{c['max_segments']}"
)
def test_each_reference_was_scored_on_the_clip_this_suite_builds(recorded):
    # A changed generator would leave the scores typed for another clip; length and level tell.
    clip = mos_reference.scored_clip(recorded["seconds"], recorded["seed"], recorded["max_segments"])

    now = mos_reference.describe(clip)

    assert now["samples"] == recorded["samples"]
    assert now["rms"] == pytest.approx(recorded["rms"], rel=1e-6)
    assert now["mean_abs"] == pytest.approx(recorded["mean_abs"], rel=1e-6)


def test_the_references_come_from_the_speechmos_whose_models_we_load():
    from importlib.metadata import version

    record = mos_reference.load()

    recorded = [(c["seconds"], c["seed"], c["max_segments"]) for c in record["clips"]]
    assert recorded == mos_reference.CLIPS, "the script's clips changed since its last run"
    assert record["versions"]["speechmos"] == version("speechmos")
    # quality.py's mel filters follow librosa 0.9.1, the version speechmos names.
    assert record["versions"]["librosa"] == "0.9.1"


def test_long_clip_costs_one_segment_by_default_and_every_second_with_all(estimator):
    clip = speechlike(12.5, 2)

    assert estimator.estimate(clip, SR16).segments == 1
    # speechmos: int(floor(12.5) - 9.01) + 1 segments, one a second
    assert quality.Estimator(max_segments=None).estimate(clip, SR16).segments == 3


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
def test_mos_sample_is_the_same_ids_in_every_revision_and_about_the_share():
    ids = [f"req-{i}" for i in range(20_000)]

    first = [recording.mos_sampled(i, 0.05) for i in ids]
    again = [recording.mos_sampled(i, 0.05) for i in ids]

    assert first == again
    assert 0.04 < sum(first) / len(ids) < 0.06
    assert not any(recording.mos_sampled(i, 0.0) for i in ids[:1000])
    assert all(recording.mos_sampled(i, 1.0) for i in ids[:1000])


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
    code = ops_cli.main(["compare", *args])
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
