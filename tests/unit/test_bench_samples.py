"""Benchmarks time only successes: a fast error or an empty body is a failed sample, not a fast one."""

from __future__ import annotations

import pytest

from bench.common import failed_sample


@pytest.mark.parametrize(
    ("status", "body_bytes", "why"),
    [(503, 40, "status 503"), (500, 0, "status 500"), (200, 0, "empty body"), (200, 4096, None)],
)
def test_a_sample_counts_only_when_200_with_a_body(status, body_bytes, why):
    assert failed_sample(status, body_bytes) == why
