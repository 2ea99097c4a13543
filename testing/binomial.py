"""What a random share of requests gives: the counts a Binomial(n, p) lands in but for rare tails, for
tests of a mirror's share (tests/system/test_shadow.py, tests/e2e/test_knative_mirror.py)."""

from __future__ import annotations

import math


def count_range(n: int, p: float, tail: float = 1e-4) -> tuple[int, int]:
    """The counts k with P(X < k) >= tail and P(X > k) >= tail for X ~ Binomial(n, p)."""
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    low = next(k for k in range(n + 1) if sum(pmf[: k + 1]) >= tail)
    high = next(k for k in range(n, -1, -1) if sum(pmf[k:]) >= tail)
    return low, high
