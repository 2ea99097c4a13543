"""KEDA's scale loop around an HPA (kedacore/keda pkg/scaling/executor/scale_scaledobjects.go):

* every pollingInterval KEDA asks each trigger whether it is active (value > activation threshold);
  an active trigger at zero replicas scales to max(minReplicaCount, 1) at once; the HTTP add-on's
  external-push scaler pushes instead of waiting for the poll;
* with every trigger inactive for cooldownPeriod since the last active poll (and past
  initialCooldownPeriod), KEDA scales to minReplicaCount;
* between 1 and maxReplicaCount the HPA KEDA owns decides, every sync period, from each trigger as
  an AverageValue external metric (hpa.per_pod_replicas), the largest proposal winning, then the
  behavior (hpa.Behavior).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Triggers:
    prom_threshold: float
    prom_activation: float
    http_target: float
    kafka_threshold: float
    kafka_activation: float

    def active(self, queue_depth: float | None, http_concurrency: float, kafka_lag: float) -> bool:
        """KEDA's IsActive over triggers; queue_depth is None when Prometheus has no series (no pods):
        ignoreNullValues makes that 0, never active."""
        if self.prom_threshold > 0 and queue_depth is not None and queue_depth > self.prom_activation:
            return True
        if self.http_target > 0 and http_concurrency > 0:
            return True
        return self.kafka_threshold > 0 and kafka_lag > self.kafka_activation

    def metrics(
        self, queue_depth: float | None, http_concurrency: float, kafka_lag: float
    ) -> list[tuple[float, float]]:
        """(usage, target per pod) for each trigger, as the HPA reads them."""
        out = []
        if self.prom_threshold > 0:
            out.append((queue_depth or 0.0, self.prom_threshold))
        if self.http_target > 0:
            out.append((http_concurrency, self.http_target))
        if self.kafka_threshold > 0:
            out.append((kafka_lag, self.kafka_threshold))
        return out


class Executor:
    """Activation and cooldown (0 <-> 1); the HPA above it handles 1 <-> N."""

    def __init__(self, cooldown_s: float, initial_cooldown_s: float, min_replicas: int):
        self.cooldown_s = cooldown_s
        self.initial_cooldown_s = initial_cooldown_s
        self.min_replicas = min_replicas
        self.last_active_s: float | None = None

    def decide(self, now_s: float, active: bool, replicas: int) -> int | None:
        """The replica count KEDA sets itself now, or None to leave it to the HPA.

        RequestScale's cases: active at zero scales to max(minReplicaCount, 1); inactive with
        minReplicaCount 0 scales to zero once cooldownPeriod has passed since the last active poll
        (never before initialCooldownPeriod from creation, at 0 s here); inactive below a
        minReplicaCount above 0 raises to it. A minReplicaCount above 0 leaves every scale-down to
        the HPA, whose minReplicas is that count."""
        if active:
            self.last_active_s = now_s
            if replicas == 0:
                return max(self.min_replicas, 1)
            return None
        if self.min_replicas == 0:
            if replicas > 0 and now_s >= self.initial_cooldown_s:
                since = now_s - (self.last_active_s if self.last_active_s is not None else -1e18)
                if since >= self.cooldown_s:
                    return 0
            return None
        if replicas < self.min_replicas:
            return self.min_replicas
        return None
