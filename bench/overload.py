"""Overload for five minutes: four times the predictor's capacity, one maximum-size text in eight.

The long version of tests/system/test_overload.py (same generator, testing/load.py). Capacity is measured
on the same predictor first, one request at a time; figures are ratios to it: admitted p99 against
REQUEST_TIMEOUT_S plus one maximum-size synthesis (the queue's bound), resident-memory drift after
the first minute against the resident size when the load started.
"""

from __future__ import annotations

from bench.common import Predictor, Row, Session, SuiteResult, log
from testing.load import MiB, overload

MAX_CHARS = 5000  # MAX_TEXT_CHARS's default: the largest text a request may carry
SHORT = "Overload keeps arriving."
LONG = ("Maximum-size inputs are mixed into the load, one in eight, to hold memory to its bound. " * 60)[
    :MAX_CHARS
]
TIMEOUT_S = 30.0  # REQUEST_TIMEOUT_S's default


def run(session: Session, duration_s: float = 300.0, engine: str = "onnx") -> SuiteResult:
    res = SuiteResult()
    p = Predictor(session, session.path("model"), ENGINE=engine, MAX_QUEUE="8")
    p.wait_ready()
    log(f"overload: 4x capacity for {duration_s:g} s ({engine}, one {MAX_CHARS}-character text in 8)")
    report = overload(p.url, p.proc.pid, SHORT, LONG, duration_s=duration_s, settle_s=60)
    summary = report.summary()
    start_rss = report.rss_samples[0][1] if report.rss_samples else 0
    bound = TIMEOUT_S + report.long_s
    others = sum(v for k, v in report.statuses.items() if k not in (200, 503))
    res.rows += [
        Row("overload", "statuses other than 200/503", others, "", goal="0", met=others == 0),
        Row(
            "overload",
            "503 without Retry-After",
            report.refused_without_retry_after,
            "",
            goal="0",
            met=report.refused_without_retry_after == 0,
        ),
        Row(
            "overload",
            "admitted p99",
            report.admitted_p99_s,
            "s",
            "REQUEST_TIMEOUT_S + one max-size synthesis",
            bound,
            report.admitted_p99_s / bound,
            goal="<= 1x",
            met=report.admitted_p99_s <= bound,
        ),
        Row(
            "overload",
            "resident drift after 1 min",
            report.drift_bytes / MiB,
            "MiB",
            "resident at load start",
            start_rss / MiB,
            report.drift_bytes / start_rss if start_rss else None,
            goal="<= 0.05x",
            met=bool(start_rss) and report.drift_bytes <= 0.05 * start_rss,
        ),
    ]
    res.details["overload"] = summary
    res.details["peak_resident_mib"] = p.metric("tts_process_peak_resident_bytes") / MiB
    return res
