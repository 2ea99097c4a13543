"""Pods: start (schedule, image pull, the profile's cold start, the first passing startup and readiness
probes),
serve their FIFO queue with as many syntheses at once as they have engine workers, and drain on
scale-down."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


def _next_probe(t: float, period: float) -> float:
    """The first tick of a probe run every `period` seconds from container start at or after t."""
    return math.ceil(t / period - 1e-9) * period if period > 0 else t


@dataclass
class PodTiming:
    schedule_s: float
    image_pull_s: float
    cold_start_s: float
    readiness_period_s: float
    startup_period_s: float = 0.0  # 0: no startup probe

    def ready_after(self) -> float:
        """Seconds from creation to Ready: the container starts after scheduling and the pull, the
        process is ready cold_start_s later, and the probes see it (probed)."""
        return self.schedule_s + self.image_pull_s + self.probed(self.cold_start_s)

    def probed(self, process_ready_s: float) -> float:
        """Seconds from container start to Ready for a process ready ``process_ready_s`` after it: the
        startup probe, if any, passes at its next tick, and the kubelet marks the pod Ready at the
        readiness probe's next tick after that (both probes run every period from container start;
        readiness is not probed until startup has passed)."""
        started = _next_probe(process_ready_s, self.startup_period_s)
        return _next_probe(started, self.readiness_period_s)


@dataclass
class Pod:
    id: int
    created_s: float
    ready_s: float  # inf until its process is ready and the probes have seen it
    state: str = "starting"  # starting | ready | draining | gone
    running: int = 0  # syntheses under way, at most the pod's engine workers
    queue: deque = field(default_factory=deque)  # request indices waiting for the engine
    removed_s: float | None = None
    container_s: float | None = None  # when its container started (its cold start began)

    @property
    def busy(self) -> bool:
        return self.running > 0

    @property
    def in_flight(self) -> int:
        return len(self.queue) + self.running
