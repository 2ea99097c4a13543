"""Canary verdict: join stable's and canary's shadow records by request id, measure, PASS or FAIL.

    stable records ─┐                     ┌─ match rate, latency p50/p99, error rate,
                    ├─ join on "id" ─> pairs ─┤  duration ratio, mel-cepstral distortion, MOS
    canary records ─┘                     └─ thresholds -> PASS | FAIL + reasons (+ a PNG)

Latency, errors, durations and distances are computed over matched pairs only: both revisions then
answered the same requests, so a canary that missed the slow ones cannot look faster. MOS
(DNSMOS estimates on a sampled share of records, the same ids on both sides) is compared over the
pairs scored on both sides: each side's mean with a 95 % confidence interval, and the paired
difference, whose interval is much narrower than either side's because a text's own difficulty
cancels out.
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# numpy, orjson and boto3 are imported where used: the CLI builds its parser from Thresholds before
# `serve` starts its cold-start download, and must not pay for them there.


class CompareError(Exception):
    """Input compare cannot judge (missing records, nothing in common); the CLI exits 2."""


# The MOS estimates compare reads from records (predictor.shadow.recorder.MOS_FIELDS), with their
# names; --max-mos-drop judges each. Both, because on the default voice each misses what the other
# sees: P.808 falls under band limiting (low-pass, 8 kHz) where OVRL stays put, OVRL falls under
# clipping where P.808 may not (docs/canary.md, Quality (MOS)).
MOS_NAMES = {"mos_p808": "MOS P.808", "mos_ovrl": "MOS P.835 OVRL"}
# Fewest pairs scored on both sides for a MOS verdict. Two unseeded renditions of one text differ in
# P.808 by sd ~0.13 on the default voice (bench quality: 0.09 within a text, x sqrt 2), so 20 pairs
# put the mean difference's 95 % interval near ±0.06, about half the drop one would judge (0.1).
MIN_MOS_PAIRS = 20


# --- reading records ---------------------------------------------------------------------------
def _parse_jsonl(data: bytes, where: str) -> list[dict[str, Any]]:
    import orjson

    records = []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CompareError(f"{where}:{n} is not JSON: {exc}") from None
        if not (
            isinstance(record, dict)
            and isinstance(record.get("id"), str)
            and isinstance(record.get("status"), int)
            and isinstance(record.get("latency_s"), (int, float))
        ):
            raise CompareError(
                f"{where}:{n} is not a shadow record (needs a string id, an integer status, a numeric latency_s)"
            )
        records.append(record)
    return records


def load_records(uri: str) -> list[dict[str, Any]]:
    """Every record under an s3:// prefix, in a local JSONL file, or in a directory's *.jsonl files."""
    from predictor.errors import StorageError
    from predictor.storage.uri import parse_uri

    try:
        scheme, root, prefix = parse_uri(uri)
    except StorageError as exc:
        raise CompareError(str(exc)) from None
    if scheme == "s3":
        return _load_s3(root, prefix, uri)
    path = Path(root)
    if path.is_file():
        return _parse_jsonl(path.read_bytes(), str(path))
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*.jsonl") if not p.name.startswith(".")
        )  # dot files: partial writes
        return [r for f in files for r in _parse_jsonl(f.read_bytes(), str(f))]
    raise CompareError(f"{uri}: no such file or directory")


def _load_s3(bucket: str, prefix: str, uri: str) -> list[dict[str, Any]]:
    from botocore.exceptions import BotoCoreError, ClientError

    from predictor.storage.s3 import s3_client

    client = s3_client(concurrency=4)
    records: list[dict[str, Any]] = []
    try:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""
        )
        for page in pages:
            for obj in page.get("Contents", []):
                if obj["Key"].endswith(".jsonl"):
                    body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
                    records += _parse_jsonl(body, f"s3://{bucket}/{obj['Key']}")
    except (BotoCoreError, ClientError) as exc:
        raise CompareError(f"{uri}: {exc}") from None
    return records


def _by_id(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    # A request id seen twice (a client retry reusing its id) counts once: its first answer.
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r.get("ts") or 0.0):
        out.setdefault(r["id"], r)
    return out


# --- the report ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Thresholds:
    min_match_rate: float = 0.95  # fraction of stable's requests the canary also recorded
    max_p50_increase: float = 0.10  # canary p50 may be at most 10 % above stable's
    max_p99_increase: float = 0.25
    max_error_rate_increase: float = 0.01  # absolute: one more failed request in a hundred
    max_duration_change: float = 0.05  # |median(canary/stable audio seconds) - 1|
    # Calibrated on the default voice: two unseeded renditions of one text differ by p50 ~1.2 dB,
    # p95 ~1.8 dB (noise alone); white noise at -34 dBFS over the audio gives ~2.8 dB.
    max_mcd_p50_db: float = 1.5
    max_mcd_p95_db: float = 2.5
    # Off unless asked for: records written before MOS existed, or with SHADOW_MOS_SAMPLE=0, carry none.
    max_mos_drop: float | None = None  # stable's mean minus canary's, over pairs scored on both sides


@dataclass(frozen=True)
class MosSummary:
    """One MOS estimate over the pairs scored on both sides: means, 95 % interval half-widths."""

    pairs: int
    stable_mean: float
    stable_ci: float
    canary_mean: float
    canary_ci: float
    diff_mean: float  # canary - stable, pair by pair
    diff_ci: float


@dataclass
class Report:
    stable_revision: str
    canary_revision: str
    stable_records: int
    canary_records: int
    matched: int
    match_rate: float
    latency_p50_s: tuple[float, float]  # (stable, canary), successful pairs
    latency_p99_s: tuple[float, float]
    error_rate: tuple[float, float]
    duration_ratio: float | None  # median canary/stable audio seconds
    mcd_p50_db: float | None
    mcd_p95_db: float | None
    text_mismatches: int  # pairs whose text hashes differ: the join paired different requests
    # Successful pairs carrying a MOS estimate on the stable side, on the canary side.
    mos_scored: tuple[int, int] = (0, 0)
    mos: dict[str, MosSummary] = field(default_factory=dict)  # by record field; absent: no pair scored
    reasons: list[str] = field(default_factory=list)
    # Per-pair series for the plot, not part of the JSON summary.
    latencies: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    distances: list[float] = field(default_factory=list)
    # (stable, canary) per pair scored on both sides, by record field.
    mos_pairs: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.reasons

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("latencies", "distances", "mos_pairs")}
        out["verdict"] = "PASS" if self.passed else "FAIL"
        return out


def _pct(xs: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else math.nan


def _t975(df: int) -> float:
    """Student's t 97.5 % quantile (Cornish-Fisher expansion; within 0.3 % of the table from df 3)."""
    z = 1.959963984540054
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def _mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval (nan below two values)."""
    import numpy as np

    a = np.asarray(xs, dtype=np.float64)
    if len(a) < 2:
        return (float(a.mean()) if len(a) else math.nan), math.nan
    return float(a.mean()), _t975(len(a) - 1) * float(a.std(ddof=1)) / math.sqrt(len(a))


def _mos_summary(pairs: list[tuple[dict[str, Any], dict[str, Any]]], name: str) -> MosSummary | None:
    scored = [
        (float(s[name]), float(c[name])) for s, c in pairs if _is_num(s.get(name)) and _is_num(c.get(name))
    ]
    if not scored:
        return None
    st, ca = [s for s, _ in scored], [c for _, c in scored]
    (sm, sci), (cm, cci) = _mean_ci(st), _mean_ci(ca)
    dm, dci = _mean_ci([c - s for s, c in scored])
    return MosSummary(len(scored), sm, sci, cm, cci, dm, dci)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _revision(records: dict[str, dict[str, Any]]) -> str:
    names = sorted({str(r.get("revision")) for r in records.values()})
    return names[0] if len(names) == 1 else ",".join(names)


def compare(
    stable_records: list[dict[str, Any]],
    canary_records: list[dict[str, Any]],
    thresholds: Thresholds = Thresholds(),
) -> Report:
    import numpy as np

    from predictor.audio import fingerprint

    stable, canary = _by_id(stable_records), _by_id(canary_records)
    if not stable:
        raise CompareError("the stable side holds no records")
    if not canary:
        raise CompareError("the canary side holds no records")
    ids = [i for i in stable if i in canary]
    if not ids:
        raise CompareError(
            f"no request id appears on both sides ({len(stable)} stable, {len(canary)} canary records): "
            "is the canary receiving mirrored traffic, and does the mirror pass x-request-id?"
        )
    pairs = [(stable[i], canary[i]) for i in ids]

    def ok(r: dict[str, Any]) -> bool:
        return int(r.get("status", 500)) < 400

    both_ok = [(s, c) for s, c in pairs if ok(s) and ok(c)]
    lat_s = [float(s["latency_s"]) for s, _ in both_ok]
    lat_c = [float(c["latency_s"]) for _, c in both_ok]
    errors = (sum(not ok(s) for s, _ in pairs) / len(pairs), sum(not ok(c) for _, c in pairs) / len(pairs))
    ratios = [c["audio_s"] / s["audio_s"] for s, c in both_ok if s.get("audio_s") and c.get("audio_s")]
    distances = [
        fingerprint.mel_cepstral_distortion(
            np.asarray(s["mcep"]), np.asarray(c["mcep"])
        )  # each [FRAMES, N_CEPS]
        for s, c in both_ok
        if s.get("mcep") and c.get("mcep")
    ]
    report = Report(
        stable_revision=_revision(stable),
        canary_revision=_revision(canary),
        stable_records=len(stable),
        canary_records=len(canary),
        matched=len(pairs),
        match_rate=len(pairs) / len(stable),
        latency_p50_s=(_pct(lat_s, 50), _pct(lat_c, 50)),
        latency_p99_s=(_pct(lat_s, 99), _pct(lat_c, 99)),
        error_rate=errors,
        duration_ratio=float(np.median(ratios)) if ratios else None,
        mcd_p50_db=_pct(distances, 50) if distances else None,
        mcd_p95_db=_pct(distances, 95) if distances else None,
        text_mismatches=sum(s.get("text_sha256") != c.get("text_sha256") for s, c in both_ok),
        latencies=(lat_s, lat_c),
        distances=distances,
        mos_scored=(
            sum(all(_is_num(s.get(n)) for n in MOS_NAMES) for s, _ in both_ok),
            sum(all(_is_num(c.get(n)) for n in MOS_NAMES) for _, c in both_ok),
        ),
    )
    for name in MOS_NAMES:
        summary = _mos_summary(both_ok, name)
        if summary is not None:
            report.mos[name] = summary
            report.mos_pairs[name] = (
                [float(s[name]) for s, c in both_ok if _is_num(s.get(name)) and _is_num(c.get(name))],
                [float(c[name]) for s, c in both_ok if _is_num(s.get(name)) and _is_num(c.get(name))],
            )
    if thresholds.max_mos_drop is not None:
        pairs_scored = min((report.mos[n].pairs if n in report.mos else 0) for n in MOS_NAMES)
        if pairs_scored < MIN_MOS_PAIRS:
            raise CompareError(
                f"--max-mos-drop needs at least {MIN_MOS_PAIRS} requests scored on both sides; "
                f"{pairs_scored} are (stable scored {report.mos_scored[0]}, canary {report.mos_scored[1]}, "
                f"of {len(both_ok)} requests both answered): collect longer or raise SHADOW_MOS_SAMPLE"
            )
    report.reasons = _judge(report, thresholds)
    return report


@dataclass(frozen=True)
class Check:
    """One threshold against its measurement: what the HTML report tabulates and FAIL's reasons list."""

    name: str
    field: str | None  # the Thresholds field it tests (None: a consistency check with no knob)
    measured: str
    limit: str
    passed: bool | None  # None: nothing to measure (no successful pairs, no fingerprints)
    reason: str = ""  # set when it failed

    @property
    def outcome(self) -> str:
        return {True: "PASS", False: "FAIL", None: "n/a"}[self.passed]


def checks(r: Report, t: Thresholds) -> list[Check]:
    out = [
        Check(
            "match rate",
            "min_match_rate",
            f"{r.match_rate:.1%}",
            f">= {t.min_match_rate:.1%}",
            r.match_rate >= t.min_match_rate,
            f"match rate {r.match_rate:.1%} < {t.min_match_rate:.1%}: the canary missed requests",
        )
    ]
    for name, (s, c), limit, knob in (
        ("p50", r.latency_p50_s, t.max_p50_increase, "max_p50_increase"),
        ("p99", r.latency_p99_s, t.max_p99_increase, "max_p99_increase"),
    ):
        measurable = s > 0 and not math.isnan(c)  # NaN: no pair succeeded on both sides
        out.append(
            Check(
                f"latency {name}",
                knob,
                f"{c * 1e3:.0f} ms vs {s * 1e3:.0f} ms ({_delta((s, c))})" if measurable else "-",
                f"<= +{limit:.0%}",
                not c > s * (1 + limit) if measurable else None,
                f"latency {name} {c * 1e3:.0f} ms vs {s * 1e3:.0f} ms (+{c / s - 1:.0%} > +{limit:.0%})"
                if measurable
                else "",
            )
        )
    increase = r.error_rate[1] - r.error_rate[0]
    out.append(
        Check(
            "error rate",
            "max_error_rate_increase",
            f"{r.error_rate[1]:.1%} vs {r.error_rate[0]:.1%}",
            f"<= +{t.max_error_rate_increase:.1%}",
            increase <= t.max_error_rate_increase,
            f"error rate {r.error_rate[1]:.1%} vs {r.error_rate[0]:.1%} (+{increase:.1%} "
            f"> +{t.max_error_rate_increase:.1%})",
        )
    )
    ratio = r.duration_ratio
    out.append(
        Check(
            "duration ratio",
            "max_duration_change",
            "-" if ratio is None else f"{ratio:.3f}",
            f"1 ± {t.max_duration_change:g}",
            None if ratio is None else abs(ratio - 1) <= t.max_duration_change,
            "" if ratio is None else f"duration ratio {ratio:.3f} outside 1 ± {t.max_duration_change:g}",
        )
    )
    for name, value, limit, knob in (
        ("p50", r.mcd_p50_db, t.max_mcd_p50_db, "max_mcd_p50_db"),
        ("p95", r.mcd_p95_db, t.max_mcd_p95_db, "max_mcd_p95_db"),
    ):
        out.append(
            Check(
                f"spectral distance {name}",
                knob,
                "-" if value is None else f"{value:.2f} dB",
                f"<= {limit:g} dB",
                None if value is None else value <= limit,
                "" if value is None else f"spectral distance {name} {value:.2f} dB > {limit:g} dB",
            )
        )
    for name, label in MOS_NAMES.items():
        m = r.mos.get(name)
        drop_limit = t.max_mos_drop  # None: not judged unless asked (records may carry no MOS)
        out.append(
            Check(
                f"{label} (paired)",
                "max_mos_drop",
                "-" if m is None else f"{m.diff_mean:+.2f} ± {m.diff_ci:.2f} ({m.pairs} pairs)",
                "off" if drop_limit is None else f"drop <= {drop_limit:g}",
                None if m is None or drop_limit is None else -m.diff_mean <= drop_limit,
                f"{label} dropped {-m.diff_mean:.2f} ± {m.diff_ci:.2f} "
                f"({m.stable_mean:.2f} -> {m.canary_mean:.2f}, {m.pairs} pairs) > {drop_limit:g}"
                if m is not None and drop_limit is not None
                else "",
            )
        )
    out.append(
        Check(
            "distinct texts per id",
            None,
            f"{r.text_mismatches} mismatched",
            "0",
            r.text_mismatches == 0,
            f"{r.text_mismatches} matched requests carry different texts: request ids are not unique",
        )
    )
    return out


def _judge(r: Report, t: Thresholds) -> list[str]:
    return [c.reason for c in checks(r, t) if c.passed is False]


def format_report(r: Report) -> str:
    def ms(x: float) -> str:
        return "-" if math.isnan(x) else f"{x * 1e3:.0f} ms"

    def opt(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    lines = [
        f"stable {r.stable_revision} ({r.stable_records} records)  vs  canary {r.canary_revision} ({r.canary_records} records)",
        f"match rate       {r.match_rate:.1%} ({r.matched} requests in both)",
        f"latency p50      {ms(r.latency_p50_s[0])} -> {ms(r.latency_p50_s[1])} ({_delta(r.latency_p50_s)})",
        f"latency p99      {ms(r.latency_p99_s[0])} -> {ms(r.latency_p99_s[1])} ({_delta(r.latency_p99_s)})",
        f"error rate       {r.error_rate[0]:.1%} -> {r.error_rate[1]:.1%}",
        f"duration ratio   {opt(r.duration_ratio, '.3f')} (median canary/stable)",
        f"spectral (MCD)   p50 {opt(r.mcd_p50_db, '.2f')} dB, p95 {opt(r.mcd_p95_db, '.2f')} dB ({len(r.distances)} pairs)",
        *_mos_lines(r),
        "PASS" if r.passed else "FAIL",
        *(f"  - {reason}" for reason in r.reasons),
    ]
    return "\n".join(lines)


def _mos_lines(r: Report) -> list[str]:
    if not r.mos:
        return [
            f"MOS              - (no request scored on both sides; scored: stable {r.mos_scored[0]}, "
            f"canary {r.mos_scored[1]}; see SHADOW_MOS_SAMPLE)"
        ]

    def ci(x: float) -> str:
        return "" if math.isnan(x) else f" ± {x:.2f}"

    lines = []
    for name, label in MOS_NAMES.items():
        m = r.mos.get(name)
        if m is not None:
            lines.append(
                f"{label:<16} {m.stable_mean:.2f}{ci(m.stable_ci)} -> {m.canary_mean:.2f}{ci(m.canary_ci)} "
                f"(paired {m.diff_mean:+.2f}{ci(m.diff_ci)}, {m.pairs} pairs, 95 % CI)"
            )
    return lines


def _delta(pair: tuple[float, float]) -> str:
    s, c = pair
    if math.isnan(s) or math.isnan(c) or s <= 0:
        return "-"
    return f"{(c - s) * 1e3:+.0f} ms, {c / s - 1:+.1%}"


# --- the plot and the page -------------------------------------------------------------------
def _plot_mos(ax: Any, report: Report) -> None:
    """Canary's MOS against stable's, a point per pair scored on both sides; below the diagonal: worse."""
    values: list[float] = []
    for name, label in MOS_NAMES.items():
        m = report.mos.get(name)
        if m is None:
            continue
        stable, canary = report.mos_pairs[name]
        ci = "" if math.isnan(m.diff_ci) else f" ± {m.diff_ci:.2f}"
        ax.scatter(stable, canary, s=12, alpha=0.7, label=f"{label}: paired {m.diff_mean:+.2f}{ci}")
        values += stable + canary
    if values:
        lo, hi = min(values) - 0.1, max(values) + 0.1
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
        ax.legend(loc="lower right")
        pairs = max(m.pairs for m in report.mos.values())
        ax.set_title(f"DNSMOS per request (n={pairs}, 95 % CI)")
    else:
        ax.text(0.5, 0.5, "no request scored on both sides", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("DNSMOS per request")
    ax.set(xlabel="stable MOS", ylabel="canary MOS")
    ax.grid(alpha=0.3)


def render_png(report: Report) -> bytes:
    """Latency CDFs (stable vs canary), the distance histogram and MOS per pair, as PNG bytes."""
    import numpy as np

    try:
        import matplotlib
    except ImportError:
        raise CompareError("--png and --html need matplotlib: pip install 'tts-predictor[ops]'") from None

    matplotlib.use("Agg")  # no display in CI
    import matplotlib.pyplot as plt

    fig, (ax_lat, ax_mcd, ax_mos) = plt.subplots(1, 3, figsize=(16, 4))
    for name, xs in (("stable", report.latencies[0]), ("canary", report.latencies[1])):
        if xs:
            s = np.sort(np.asarray(xs)) * 1e3
            ax_lat.step(s, np.arange(1, len(s) + 1) / len(s), where="post", label=f"{name} (n={len(s)})")
    ax_lat.set(xlabel="latency (ms)", ylabel="fraction of requests", title="latency CDF")
    ax_lat.grid(alpha=0.3)
    ax_lat.legend(loc="lower right")
    if report.distances:
        ax_mcd.hist(report.distances, bins=min(30, max(5, len(report.distances) // 2)))
    ax_mcd.set(
        xlabel="mel-cepstral distortion (dB)",
        ylabel="matched requests",
        title="spectral distance, canary vs stable",
    )
    ax_mcd.grid(alpha=0.3)
    _plot_mos(ax_mos, report)
    fig.suptitle(
        f"{report.canary_revision} vs {report.stable_revision}: {'PASS' if report.passed else 'FAIL'}"
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def write_png(report: Report, out: Path) -> None:
    """The plot of render_png, written atomically."""
    from predictor.storage.files import atomic_write_bytes

    atomic_write_bytes(out, render_png(report))


def write_html(
    report: Report, thresholds: Thresholds, out: Path, flags: dict[str, str] | None = None
) -> None:
    """One self-contained page: verdict, reasons, each threshold with its measurement, the plot.

    ``flags`` maps a Thresholds field to the CLI flag that sets it, so the page says which knob to turn.
    """
    from tts_ops.report_page import Figure, Page, Table

    flags = flags or {}

    def ms(x: float) -> str:
        return "-" if math.isnan(x) else f"{x * 1e3:.0f} ms"

    def opt(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    r = report
    overview = Table(
        "Both revisions, over the requests both answered",
        ("", "stable", "canary", "change"),
        [
            ("revision", r.stable_revision, r.canary_revision, ""),
            (
                "records",
                str(r.stable_records),
                str(r.canary_records),
                f"{r.matched} matched ({r.match_rate:.1%})",
            ),
            ("latency p50", ms(r.latency_p50_s[0]), ms(r.latency_p50_s[1]), _delta(r.latency_p50_s)),
            ("latency p99", ms(r.latency_p99_s[0]), ms(r.latency_p99_s[1]), _delta(r.latency_p99_s)),
            ("error rate", f"{r.error_rate[0]:.1%}", f"{r.error_rate[1]:.1%}", ""),
            ("duration ratio (median canary/stable)", "", "", opt(r.duration_ratio, ".3f")),
            (
                "spectral distance p50 / p95",
                "",
                "",
                f"{opt(r.mcd_p50_db, '.2f')} / {opt(r.mcd_p95_db, '.2f')} dB ({len(r.distances)} pairs)",
            ),
            *(
                (
                    f"{label} (mean ± 95 % CI)",
                    f"{m.stable_mean:.2f} ± {m.stable_ci:.2f}",
                    f"{m.canary_mean:.2f} ± {m.canary_ci:.2f}",
                    f"paired {m.diff_mean:+.2f} ± {m.diff_ci:.2f} ({m.pairs} pairs)",
                )
                for label, m in ((MOS_NAMES[n], r.mos[n]) for n in MOS_NAMES if n in r.mos)
            ),
        ],
    )
    threshold_rows = [
        (c.name, c.measured, c.limit, flags.get(c.field, "") if c.field else "", c.outcome)
        for c in checks(r, thresholds)
    ]
    Page(
        title=f"Canary verdict: {r.canary_revision} vs {r.stable_revision}",
        verdict=r.passed,
        reasons=r.reasons,
        tables=[
            overview,
            Table("Thresholds", ("check", "measured", "limit", "flag", "result"), threshold_rows),
        ],
        figures=[
            Figure(
                "Latency CDFs (stable vs canary), the spectral distance histogram and DNSMOS per request",
                render_png(r),
            )
        ],
        footer="tts-ops compare",
    ).write(out)
