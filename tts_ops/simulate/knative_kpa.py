"""Knative's Pod Autoscaler (KPA), ported from knative/serving.

`Decider.scale` follows pkg/autoscaler/scaling/autoscaler.go `(*autoscaler).Scale`: stable and panic
windows, panic threshold, max scale-up/down rates, activation scale, scale-down delay (a max over a
time window, aggregation/max/window.go) and excess burst capacity. `ScaleToZero` follows
pkg/reconciler/autoscaling/kpa/scaler.go `handleScaleToZero`: the last pod stays for the pod
retention period and the scale-to-zero grace period after the decider first asks for zero, or
for the retention alone where the activator has been in the path for the grace period already.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# The autoscaler's decision period (knative/serving pkg/autoscaler/scaling: tickInterval = 2s).
TICK_S = 2.0


@dataclass
class DeciderSpec:
    """Mirror of scaling.DeciderSpec; target_value is already target x utilization."""

    target_value: float
    total_value: float
    target_burst_capacity: float = 200.0
    panic_threshold: float = 2.0  # ratio, i.e. panic-threshold-percentage / 100
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    stable_window_s: float = 60.0
    scale_down_delay_s: float = 0.0
    activation_scale: int = 1
    reachable: bool = True


@dataclass
class ScaleResult:
    desired_pod_count: int
    excess_burst_capacity: int
    valid: bool = True


class MaxTimeWindow:
    """aggregation/max TimeWindow: the max of values recorded in the last `duration` seconds,
    bucketed by `granularity` (a bucket leaves when index - its index >= duration / granularity)."""

    def __init__(self, duration_s: float, granularity_s: float = TICK_S):
        self.size = math.ceil(duration_s / granularity_s)
        self.granularity = granularity_s
        self.maxima: deque[tuple[int, float]] = deque()  # (index, value), values descending

    def record(self, now_s: float, value: float) -> None:
        index = int(now_s // self.granularity)
        while self.maxima and value >= self.maxima[-1][1]:
            self.maxima.pop()
        while self.maxima and index - self.maxima[0][0] >= self.size:
            self.maxima.popleft()
        if self.maxima and self.maxima[-1][0] == index:
            value = max(value, self.maxima.pop()[1])
        self.maxima.append((index, value))

    def current(self) -> float:
        return self.maxima[0][1]


class Decider:
    """One revision's autoscaler; `scale` is called every tick with the observed window averages."""

    def __init__(self, spec: DeciderSpec, ready_pods_at_start: int = 0, now_s: float = 0.0):
        self.spec = spec
        # As newAutoscaler: start in panic mode when created over more than one pod.
        self.panic_time: float | None = now_s if ready_pods_at_start > 1 else None
        self.max_panic_pods = ready_pods_at_start
        self.delay_window = MaxTimeWindow(spec.scale_down_delay_s) if spec.scale_down_delay_s > 0 else None

    def scale(
        self, now_s: float, ready_pods: int, observed_stable: float, observed_panic: float
    ) -> ScaleResult:
        spec = self.spec
        ready = max(1.0, float(ready_pods))
        max_scale_up = math.ceil(spec.max_scale_up_rate * ready)
        max_scale_down = math.floor(ready / spec.max_scale_down_rate) if spec.reachable else 0.0
        dspc = math.ceil(observed_stable / spec.target_value)
        dppc = math.ceil(observed_panic / spec.target_value)
        desired_stable = int(min(max(dspc, max_scale_down), max_scale_up))
        desired_panic = int(min(max(dppc, max_scale_down), max_scale_up))
        if spec.activation_scale > 1:
            if dspc > 0 and spec.activation_scale > desired_stable:
                desired_stable = spec.activation_scale
            if dppc > 0 and spec.activation_scale > desired_panic:
                desired_panic = spec.activation_scale

        over_threshold = dppc / ready >= spec.panic_threshold
        if over_threshold:
            self.panic_time = now_s  # begin, or extend, panicking
        elif self.panic_time is not None and self.panic_time + spec.stable_window_s < now_s:
            self.panic_time = None
            self.max_panic_pods = 0

        desired = desired_stable
        if self.panic_time is not None:
            desired = max(desired, desired_panic)
            # No scale-down while panicking.
            self.max_panic_pods = max(self.max_panic_pods, desired)
            desired = self.max_panic_pods

        if self.delay_window is not None:
            self.delay_window.record(now_s, desired)
            desired = int(self.delay_window.current())

        if spec.target_burst_capacity == 0:
            ebc = 0.0
        elif spec.target_burst_capacity > 0:
            ebc = math.floor(ready_pods * spec.total_value - spec.target_burst_capacity - observed_panic)
        else:
            ebc = -1.0
        return ScaleResult(desired, int(ebc))


class ScaleToZero:
    """When the decider's (delayed) answer is 0, keep the last pod until both the pod retention period
    and the grace period have passed since it first said 0; any non-zero answer resets the clock."""

    def __init__(self, retention_s: float, grace_s: float):
        self.retention_s, self.grace_s = retention_s, grace_s
        self.hold_s = max(retention_s, grace_s)
        self.zero_since: float | None = None

    def apply(self, now_s: float, desired: int, proxy_for_s: float = 0.0) -> int:
        """`proxy_for_s`: how long the activator has been in the path (the SKS in Proxy mode). As
        handleScaleToZero's fast path: inactive for the retention period and proxied for the grace
        period is enough, so a revision the activator never left goes at the retention alone."""
        if desired > 0:
            self.zero_since = None
            return desired
        if self.zero_since is None:
            self.zero_since = now_s
        inactive = now_s - self.zero_since
        if inactive >= self.hold_s or (inactive >= self.retention_s and proxy_for_s >= self.grace_s):
            return 0
        return 1
