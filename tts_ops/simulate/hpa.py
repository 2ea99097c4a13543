"""The Kubernetes HorizontalPodAutoscaler's arithmetic, ported from kubernetes/kubernetes
pkg/controller/podautoscaler: replica_calculator.go (external metrics, AverageValue and Value, with
tolerance) and horizontal.go (behavior: stabilization windows, Pods/Percent policies over periods,
selectPolicy, min/max bounds). KEDA hands its triggers to an HPA as external metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# kube-controller-manager --horizontal-pod-autoscaler-tolerance default.
DEFAULT_TOLERANCE = 0.1
# --horizontal-pod-autoscaler-sync-period default, seconds.
DEFAULT_SYNC_S = 15.0
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


@dataclass(frozen=True)
class Policy:
    type: str  # "Pods" | "Percent"
    value: int
    period_s: int


@dataclass
class Rules:
    """HPAScalingRules: stabilization window, policies, selectPolicy (Max | Min | Disabled)."""

    window_s: float
    policies: list[Policy] = field(default_factory=list)
    select: str = "Max"


def default_scale_up() -> Rules:
    """autoscaling/v2 SetDefaults: no stabilization, max(+4 pods, +100 %) per 15 s."""
    return Rules(0, [Policy("Pods", 4, 15), Policy("Percent", 100, 15)], "Max")


def default_scale_down(window_s: float = 300) -> Rules:
    """autoscaling/v2 SetDefaults: 300 s stabilization (or the controller's flag), -100 % per 15 s."""
    return Rules(window_s, [Policy("Percent", 100, 15)], "Max")


@dataclass
class ScaleEvent:
    replica_change: int
    time_s: float


def per_pod_replicas(usage: float, target_per_pod: float, current: int, tolerance: float) -> int:
    """GetExternalPerPodMetricReplicas (metric type AverageValue)."""
    ratio = usage / (target_per_pod * current)
    if abs(1.0 - ratio) > tolerance:
        return math.ceil(usage / target_per_pod)
    return current


def value_replicas(usage: float, target: float, ready: int, current: int, tolerance: float) -> int:
    """GetExternalMetricReplicas (metric type Value): the ratio scales the ready pod count."""
    ratio = usage / target
    if abs(1.0 - ratio) <= tolerance:
        return current
    return math.ceil(ratio * ready)


def _change_in_period(period_s: float, events: list[ScaleEvent], now_s: float) -> int:
    cutoff = now_s - period_s
    return sum(e.replica_change for e in events if e.time_s > cutoff)


def scale_up_limit(
    current: int, ups: list[ScaleEvent], downs: list[ScaleEvent], rules: Rules, now_s: float
) -> int:
    """calculateScaleUpLimitWithScalingRules."""
    if rules.select == "Disabled":
        return current
    pick, result = (min, INT32_MAX) if rules.select == "Min" else (max, INT32_MIN)
    for p in rules.policies:
        start = (
            current - _change_in_period(p.period_s, ups, now_s) + _change_in_period(p.period_s, downs, now_s)
        )
        proposed = start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100))
        result = pick(result, proposed)
    return result


def scale_down_limit(
    current: int, ups: list[ScaleEvent], downs: list[ScaleEvent], rules: Rules, now_s: float
) -> int:
    """calculateScaleDownLimitWithBehaviors."""
    if rules.select == "Disabled":
        return current
    pick, result = (max, INT32_MIN) if rules.select == "Min" else (min, INT32_MAX)
    for p in rules.policies:
        start = (
            current - _change_in_period(p.period_s, ups, now_s) + _change_in_period(p.period_s, downs, now_s)
        )
        proposed = start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100))
        result = pick(result, proposed)
    return result


@dataclass
class Recommendation:
    replicas: int
    time_s: float


class Behavior:
    """One HPA's memory (recommendations, scale events) and its normalization of a desired count."""

    def __init__(self, up: Rules, down: Rules, min_replicas: int, max_replicas: int):
        self.up, self.down = up, down
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.recommendations: list[Recommendation] = []
        self.up_events: list[ScaleEvent] = []
        self.down_events: list[ScaleEvent] = []

    def stabilize(self, current: int, desired: int, now_s: float) -> int:
        """stabilizeRecommendationWithBehaviors: the lowest recommendation of the up window bounds a
        rise, the highest of the down window bounds a fall; the raw one is recorded (reusing a slot
        older than both windows)."""
        up_rec, down_rec = desired, desired
        up_cut, down_cut = now_s - self.up.window_s, now_s - self.down.window_s
        old_index = -1
        for i, rec in enumerate(self.recommendations):
            if rec.time_s > up_cut:
                up_rec = min(rec.replicas, up_rec)
            if rec.time_s > down_cut:
                down_rec = max(rec.replicas, down_rec)
            if rec.time_s < up_cut and rec.time_s < down_cut:
                old_index = i
        result = min(max(current, up_rec), down_rec)
        if old_index >= 0:
            self.recommendations[old_index] = Recommendation(desired, now_s)
        else:
            self.recommendations.append(Recommendation(desired, now_s))
        return result

    def limit(self, current: int, desired: int, now_s: float) -> tuple[int, str]:
        """convertDesiredReplicasWithBehaviorRate: (replicas, condition reason)."""
        if desired > current:
            up_limit = max(scale_up_limit(current, self.up_events, self.down_events, self.up, now_s), current)
            if self.max_replicas > up_limit:
                allowed, reason = up_limit, "ScaleUpLimit"
            else:
                allowed, reason = self.max_replicas, "TooManyReplicas"
            if desired > allowed:
                return allowed, reason
        elif desired < current:
            down_limit = min(
                scale_down_limit(current, self.up_events, self.down_events, self.down, now_s), current
            )
            if self.min_replicas < down_limit:
                allowed, reason = down_limit, "ScaleDownLimit"
            else:
                allowed, reason = self.min_replicas, "TooFewReplicas"
            if desired < allowed:
                return allowed, reason
        return desired, "DesiredWithinRange"

    def normalize(self, current: int, desired: int, now_s: float) -> int:
        """Stabilize, then rate-limit and bound; record the change as a scale event."""
        stabilized = self.stabilize(current, desired, now_s)
        replicas, _ = self.limit(current, stabilized, now_s)
        self.record(current, replicas, now_s)
        return replicas

    def record(self, current: int, new: int, now_s: float) -> None:
        longest_up = max((p.period_s for p in self.up.policies), default=0)
        longest_down = max((p.period_s for p in self.down.policies), default=0)
        self.up_events = [e for e in self.up_events if e.time_s > now_s - longest_up]
        self.down_events = [e for e in self.down_events if e.time_s > now_s - longest_down]
        if new > current:
            self.up_events.append(ScaleEvent(new - current, now_s))
        elif new < current:
            self.down_events.append(ScaleEvent(current - new, now_s))
