"""Overload: four times what the predictor can serve, maximum-size texts mixed in, for a bounded time.

Every request gets 200 or 503 with Retry-After (nothing else, no connection dropped); no engine time
goes to a request that is refused or dropped from the queue; admitted requests
finish within the queue's bound (REQUEST_TIMEOUT_S plus one maximum-size synthesis); resident memory
is flat once the first requests have run. Capacity and the bound are measured in the same run, on the
same predictor (testing/load.py). This is the short version (40 s of load); `python -m bench overload`
runs five minutes.
"""

from __future__ import annotations

from predictor.text import normalize, split_segments
from testing.load import MiB, overload

MAX_CHARS = 600
SHORT = "Overload keeps arriving."
LONG = ("Maximum-size inputs are mixed into the load, one in eight, to hold memory to its bound. " * 10)[
    :MAX_CHARS
]
TIMEOUT_S = 4.0


def test_four_times_capacity_gets_only_200_or_503_with_retry_after_bounded_latency_flat_memory(
    start_predictor,
):
    predictor = start_predictor(
        ENGINE="onnx", MAX_TEXT_CHARS=str(MAX_CHARS), MAX_QUEUE="4", REQUEST_TIMEOUT_S=str(TIMEOUT_S)
    )

    report = overload(predictor.url, predictor.proc.pid, SHORT, LONG, duration_s=40, settle_s=10)

    summary = report.summary()
    print("overload:", summary)  # the figures docs/reliability.md ("Overload") quotes (pytest -s)
    assert set(report.statuses) <= {200, 503}, summary
    assert report.statuses[503] > 0, f"4x capacity never filled the queue: {summary}"
    assert report.refused_without_retry_after == 0, summary
    # Nothing refused or dropped cost engine time: every segment the engine ran was of a request
    # answered 200 (an admitted request's later segments are never refused: Batcher.submit).
    segments = {
        kind: len(split_segments(normalize(text), 300)) for kind, text in (("short", SHORT), ("max", LONG))
    }
    assert report.synthesized == sum(n * segments[kind] for kind, n in report.answered.items()), summary
    # Overload must not collapse what is served. Not a fraction near 1: capacity is measured alone, and
    # under the load the engine shares two CPUs with the load's own clients (here the mix ran at 1.03x
    # capacity; on a loaded 2-CPU CI runner once at 0.40x).
    assert report.statuses[200] >= 0.25 * report.capacity_rps * 40, summary
    # Admitted: at most REQUEST_TIMEOUT_S in the queue, then its segments, each later one queued behind
    # at most MAX_QUEUE calls no longer than one of a maximum-size text's segments (requests share the
    # engine segment by segment), all slowed by the machine's other load: twice what they took alone.
    per_segment_s = report.long_s / segments["max"]
    behind_s = (segments["max"] - 1) * 4 * per_segment_s
    assert report.admitted_p99_s <= TIMEOUT_S + 2 * (report.long_s + behind_s), summary
    assert report.drift_bytes <= 64 * MiB, summary
