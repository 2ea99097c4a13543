"""The rate limit on client-error log lines (predictor.observability.logs.RateLimit), in-process."""

from __future__ import annotations

import logging

from predictor.observability.logs import RateLimit


def _record(msg: str) -> logging.LogRecord:
    return logging.makeLogRecord({"name": "predictor.client_errors", "msg": msg, "args": ()})


def test_a_repeated_message_passes_its_burst_then_the_next_window_counts_the_dropped(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("predictor.observability.logs.time.monotonic", lambda: now[0])
    limit = RateLimit(burst=3, window_s=60.0)

    passed = [limit.filter(_record("grpc %s: %s")) for _ in range(10)]
    other = limit.filter(_record("another message"))
    now[0] += 60.0
    later = _record("grpc %s: %s")

    assert passed == [True] * 3 + [False] * 7
    assert other  # each template has its own budget
    assert limit.filter(later) and later.suppressed == 7
    assert not hasattr(_record("x"), "suppressed")
