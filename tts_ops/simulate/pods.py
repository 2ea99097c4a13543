"""Pods: start (schedule, image pull, the profile's cold start, the first passing startup and readiness
probes),
serve their FIFO queue with as many syntheses at once as they have engine workers, and drain on
scale-down."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


def tick_at_or_after(t: float, period: float, phase: float = 0.0) -> float:
    """The first tick of a ticker firing at phase + k * period at or after t (t itself without one):
    the kubelet's probes and PLEG, the add-on scaler's loops, the activator's probe rounds."""
    if period <= 0:
        return t
    return phase + math.ceil((t - phase) / period - 1e-9) * period


@dataclass
class PodTiming:
    """A pod's start, as the kubelet runs it (kubernetes pkg/kubelet: SyncPod, prober/worker.go,
    prober_manager.go), in seconds:

    created --schedule_s--> probe workers start --sandbox_s + image_pull_s--> process starts
    --cold_start_s--> process ready --probes' next tick--> Ready --routed_s--> first request.

    The kubelet starts a pod's probe workers just before it creates the sandbox and the containers,
    and each ticks every period from then. A startup probe's pass sets the container started and the
    kubelet then runs the readiness probe at once (a manual trigger), so with a startup probe the pod
    is Ready at the startup probe's first tick after the process is ready. Without one, the readiness
    probe runs (the same trigger) when the kubelet sees the container running, at its PLEG's next
    relist, and ticks from there. Under Knative the readiness probe is queue-proxy's, a container of
    its own without a startup probe, while the startup probe stays on ours: Ready waits for both
    (`queue_proxy`)."""

    schedule_s: float  # created -> probe workers start: scheduler, kubelet admission, volumes
    image_pull_s: float
    cold_start_s: float
    readiness_period_s: float
    startup_period_s: float = 0.0  # 0: no startup probe
    sandbox_s: float = 0.0  # probe workers start -> the process starts: sandbox, network, container
    routed_s: float = 0.0  # Ready -> the interceptor or the activator sends the pod requests
    queue_proxy: bool = False  # Knative: the readiness probe runs on queue-proxy's container

    @property
    def container_after(self) -> float:
        """Seconds from the probe workers' start to the container's process start."""
        return self.sandbox_s + self.image_pull_s

    def ready_after(self) -> float:
        """Seconds from creation to the first request the data path can send: the process is ready
        cold_start_s after its start, the probes see it (probed), and the data path learns of it."""
        return self.schedule_s + self.probed(self.container_after + self.cold_start_s) + self.routed_s

    def probed(self, process_ready_s: float, seen_s: float | None = None) -> float:
        """Seconds from the probe workers' start to Ready for a process ready ``process_ready_s``
        after it, its container seen running by the kubelet ``seen_s`` after it (its start where
        not given): the docstring above says which probe's tick decides."""
        seen = self.container_after if seen_s is None else seen_s
        readiness = seen + tick_at_or_after(process_ready_s - seen, self.readiness_period_s)
        if self.startup_period_s <= 0:
            return readiness
        started = tick_at_or_after(process_ready_s, self.startup_period_s)
        return max(started, readiness) if self.queue_proxy else started


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
    probes_s: float | None = None  # when the kubelet started its probe workers (their ticks' origin)
    address: float = 0.0  # its rank in the order Knative's activator sorts pod addresses in
    last_end_s: float = -math.inf  # when its last synthesis ended (a call soon after is back to back)

    @property
    def busy(self) -> bool:
        return self.running > 0

    @property
    def in_flight(self) -> int:
        return len(self.queue) + self.running
