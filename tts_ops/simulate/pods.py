"""Pods: start (schedule, image pull, the profile's cold start, the first passing readiness probe),
serve one synthesis at a time from their own FIFO queue, and drain on scale-down."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class PodTiming:
    schedule_s: float
    image_pull_s: float
    cold_start_s: float
    readiness_period_s: float

    def ready_after(self) -> float:
        """Seconds from creation to Ready: the container starts after scheduling and the pull, the
        process is ready cold_start_s later, and the kubelet sees it at its next probe (probes every
        period from container start)."""
        start = self.schedule_s + self.image_pull_s
        period = self.readiness_period_s
        return start + (
            math.ceil(self.cold_start_s / period - 1e-9) * period if period > 0 else self.cold_start_s
        )


@dataclass
class Pod:
    id: int
    created_s: float
    ready_s: float
    state: str = "starting"  # starting | ready | draining | gone
    busy: bool = False
    queue: deque = field(default_factory=deque)  # request indices waiting for the engine
    removed_s: float | None = None

    @property
    def in_flight(self) -> int:
        return len(self.queue) + (1 if self.busy else 0)
