"""The event loop: requests arrive, are held (activator / interceptor / Kafka) or queue at a pod, are
synthesized by the pod's engine workers (pod.engine_workers at once, where the profile measured what
a call costs beside another: overlap_factor; else one at a time); controllers tick and start or drain
pods.

A pod of several workers runs a call that starts with nothing else running or waiting at the
profile's time alone (the predictor's solo worker, with every CPU), and a call that starts beside
others at overlap_factor times that (a worker's share of the CPUs), fixed at its start.

Knative's revision timeout ends a request `timeout` seconds after the activator received it, with 504
(measured on the cluster: tests/e2e/test_knative_timeout.py): held by the activator or queued at its
pod, it is dropped (the predictor cancels a request whose client has gone before its engine call); in
synthesis, the engine finishes that call for nobody (the v2 route makes one call per text), so the pod
stays busy until then. A timed-out request has no latency: it counts in `timed_out`.

Where Knative's requests wait (knative/serving v0.50.0, the release the local cluster runs): with the
activator in the path (the SKS in Proxy mode: at zero, and whenever the excess burst capacity is
negative, which with the default target-burst-capacity of 200 is always for a few pods), the
activator holds up to 10,000 requests per revision (pkg/activator/net/throttler.go
breakerQueueDepth; one more is answered 503) and sends a pod at most `containerConcurrency`. Out of
the path (Serve mode: scale above 0 and the excess burst capacity >= 0, e.g. target-burst-capacity
0), requests go straight to a pod, whose queue-proxy holds `containerConcurrency` in flight and 10
times that queued (pkg/queue/sharedmain buildBreaker) and answers 503 beyond. With
`containerConcurrency` 0 neither limits a pod: the predictor's own MAX_QUEUE answers 503.

Knative's activator picks a pod as its throttler does (serving pkg/activator/net/throttler.go and
lb_policy.go), over its pods sorted by address: with `containerConcurrency` 1-3 the first that has
a free slot, above 3 round robin from the one after the last pick, at 0 the less loaded of two at
random. The addresses' order is a draw (the activator compares them as strings, so it is not the
order the pods were made in). Under KEDA requests go through the interceptor's keep-alive pool to
the Service (_pick_pod).

Simplifications, each on the side of the autoscaler under study rather than the predictor: with the
activator out of the path requests go to the least-loaded ready pod; network hops cost nothing; a
pod removed by a scale-down finishes its queue (the drain) and costs replica-seconds until then.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tts_ops.simulate import hpa, keda, knative_kpa, settings
from tts_ops.simulate.node import Cores, Finish
from tts_ops.simulate.pods import Pod, PodTiming, tick_at_or_after
from tts_ops.simulate.profile import BACK_TO_BACK_S, Profile
from tts_ops.simulate.trace import Trace

_WORK, _CONTAINER, _READY, _TICK, _SCRAPE, _HPA, _SAMPLE, _TIMEOUT, _PUSH, _NODE = range(10)
ACTIVATOR_QUEUE = 10_000  # requests the activator holds per revision (breakerQueueDepth)
QUEUE_PROXY_DEPTH = 10  # queue-proxy queues this many times containerConcurrency


def percentile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank q-quantile of sorted values (None when there are none), to 4 decimals."""
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))], 4)


@dataclass
class Timeline:
    t: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    starting: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # held + queued at pods


@dataclass
class Result:
    flavour: str
    arrivals: list[float]
    latencies: list[float | None]  # None: rejected
    cold_waits: int
    rejected: int
    timed_out: int
    replica_seconds: float
    max_replicas: int
    pod_starts: int
    duration_s: float
    timeline: Timeline
    second_ready_s: float | None = None  # when a second pod was first ready beside another

    def summary(self) -> dict[str, Any]:
        done = sorted(x for x in self.latencies if x is not None)
        first = self.latencies[0] if self.latencies else None
        second = self.second_ready_s
        second_s = round(second - self.arrivals[0], 2) if second is not None and self.arrivals else None
        return {
            "flavour": self.flavour,
            "requests": len(self.latencies),
            "completed": len(done),
            "latency_p50_s": percentile(done, 0.50),
            "latency_p95_s": percentile(done, 0.95),
            "latency_p99_s": percentile(done, 0.99),
            "latency_max_s": round(done[-1], 4) if done else None,
            "first_request_latency_s": round(first, 4) if first is not None else None,
            "cold_start_waits": self.cold_waits,
            "rejected": self.rejected,
            "timed_out": self.timed_out,
            "replica_seconds": round(self.replica_seconds, 1),
            "max_replicas": self.max_replicas,
            "second_replica_ready_s": second_s,
            "pod_starts": self.pod_starts,
            "simulated_s": round(self.duration_s, 1),
        }


class Simulation:
    def __init__(self, flavour: str, values: dict[str, Any], profile: Profile, trace: Trace):
        self.flavour, self.v, self.profile, self.trace = flavour, values, profile, trace
        self.timing = PodTiming(
            values["pod.schedule_s"],
            values["pod.image_pull_s"],
            profile.cold_start_s,
            values["pod.readiness_period_s"],
            values["pod.startup_period_s"],
            sandbox_s=values["pod.sandbox_s"]
            + (values["kpa.queue_proxy_s"] if flavour == "knative" else 0.0),
            routed_s=values["keda.http.endpoints_s" if flavour == "keda" else "kpa.activator_routes_s"],
            queue_proxy=flavour == "knative",
        )
        # The requests so far: a closed-loop trace's callers add theirs as they are answered (_ended).
        self.times, self.chars = list(trace.times), list(trace.chars)
        n = len(trace)
        self.latency: list[float | None] = [None] * n
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.pods: list[Pod] = []
        self.next_pod = 0
        self.held: deque[int] = deque()  # activator / interceptor
        self.kafka: deque[int] = deque()  # undelivered CloudEvents
        self.is_event = [False] * n
        self.forwarded = [0.0] * n  # when each request reached its pod
        self.abandoned = [False] * n  # answered 504 by Knative while its pod still synthesizes it
        self.done = [False] * n
        self.cold_waits = self.rejected = self.timed_out = self.pod_starts = self.max_replicas = 0
        self.in_system = 0
        self.alive = 0
        self.now = 0.0
        self.conc_integral = 0.0
        self.arrivals_count = 0
        self.pod_seconds = 0.0
        self.timeline = Timeline()
        self.second_ready_s: float | None = None
        # The interceptor forwards and a full pod answers 503; so does Knative's activator when
        # containerConcurrency is 0 (no breaker holds the request back).
        self.full_pod_refuses = flavour == "keda" or values["kpa.container_concurrency"] <= 0
        self.activator_in_path = True  # Knative's SKS starts in Proxy mode (at zero long before)
        self.proxy_since = -math.inf
        self.max_pods = values["replicas.max"] or 10**6
        self.min_pods = values["replicas.min"]
        self.workers = values["pod.engine_workers"] if profile.overlap_factor > 0 else 1
        self.cores = Cores(values["node.cpus"])
        self.random = random.Random(values["random.seed"])
        # The HTTP add-on scaler's two loops (its ping of the interceptors' counts, its push stream to
        # KEDA) run on tickers started long before the trace: their phases are a draw of the run.
        self.ping_phase = self.random.uniform(0, values["keda.http.queue_tick_s"])
        self.stream_phase = self.random.uniform(0, values["keda.http.stream_interval_s"])
        # At zero: the scaler's ping that counts the first held request (its push to KEDA is due).
        self.ping_at: float | None = None
        # The kubelet's PLEG relists containers on a ticker of its own (pod.relist_s), and the
        # activator probes a revision's pods on one of its own (kpa.activator_probe_s).
        self.relist_phase = self.random.uniform(0, values["pod.relist_s"])
        self.activator_phase = self.random.uniform(0, values["kpa.activator_probe_s"])
        # The pods' addresses, in the order the activator sorts them: a draw of their own, so the
        # other draws of a seed stay as they were. Its round robin's next index.
        self.addresses = random.Random(f"{values['random.seed']}-addresses")
        self.round_robin = 0
        # The KEDA interceptor's idle keep-alive connections, each to the pod kube-proxy picked when it
        # was dialled, newest last (_pick_pod).
        self.idle: list[Pod] = []
        self.owners: dict[tuple[str, int, int], Pod] = {}  # a piece of work's pod: a synthesis, a cold start

    # --- bookkeeping ---------------------------------------------------------------------------
    def _push(self, t: float, kind: int, data: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            self.conc_integral += self.in_system * dt
            self.pod_seconds += self.alive * dt
            self.now = t

    def _ready_pods(self) -> list[Pod]:
        return [p for p in self.pods if p.state == "ready"]

    def _active_pods(self) -> list[Pod]:
        return [p for p in self.pods if p.state in ("starting", "ready")]

    # --- pods ----------------------------------------------------------------------------------
    def _scale_to(self, target: int) -> None:
        target = max(self.min_pods, min(self.max_pods, target))
        active = self._active_pods()
        if target > len(active):
            for _ in range(target - len(active)):
                pod = Pod(self.next_pod, self.now, math.inf, address=self.addresses.random())
                self.next_pod += 1
                self.pods.append(pod)
                self.alive += 1
                self.pod_starts += 1
                pod.probes_s = self.now + self.timing.schedule_s
                self._push(pod.probes_s + self.timing.container_after, _CONTAINER, pod)
            self.max_replicas = max(self.max_replicas, self.alive)
        elif target < len(active):
            # Not-yet-ready pods first (newest first), then the least busy ready ones.
            victims = sorted(active, key=lambda p: (p.state == "ready", p.in_flight, -p.created_s))
            for pod in victims[: len(active) - target]:
                if pod.in_flight == 0:
                    self._gone(pod)
                else:
                    pod.state = "draining"

    def _gone(self, pod: Pod) -> None:
        cold = _cold_start(pod)
        if cold in self.cores:  # scaled away while starting
            self.owners.pop(cold)
            self._timed(self.cores.end(self.now, cold))
        pod.state = "gone"
        pod.removed_s = self.now
        self.alive -= 1
        self.pods.remove(pod)

    def _capacity(self) -> int:
        """Requests a pod takes from the activator (Knative) or the interceptor (KEDA) before the next
        waits (Knative's breaker) or is refused 503 (a full MAX_QUEUE)."""
        if self.flavour == "knative":
            cc = self.v["kpa.container_concurrency"]
            return cc if cc > 0 else 1 + self.v["pod.max_queue"]
        return 1 + self.v["pod.max_queue"]

    def _knative_direct(self, i: int, pod: Pod) -> None:
        """Knative without the activator in the path: straight to a pod, whose queue-proxy holds
        containerConcurrency in flight and 10 times that queued, and answers 503 beyond."""
        cc = self.v["kpa.container_concurrency"]
        limit = cc * (1 + QUEUE_PROXY_DEPTH) if cc > 0 else self._capacity()
        if pod.in_flight >= limit:
            self._reject(i)
        else:
            self._assign(pod, i)

    def _assign(self, pod: Pod, i: int) -> None:
        self.forwarded[i] = self.now
        if pod.running >= self.workers:
            pod.queue.append(i)
        else:
            self._synthesize(pod, i)

    def _synthesize(self, pod: Pod, i: int) -> None:
        """Start request i's synthesis on pod: at the profile's time alone when nothing else runs or
        waits there, else beside the others (overlap_factor), fixed at its start; alone but right
        after the pod's last call (BACK_TO_BACK_S), at back_to_back_factor times it. The node's cores
        (node.cpus) are shared with every other synthesis and cold start under way (node.py)."""
        chars = self.chars[i]
        alone = self.workers == 1 or (pod.running == 0 and not pod.queue)
        if not alone:
            seconds = self.profile.overlapping_s(chars)
        elif self.now - pod.last_end_s < BACK_TO_BACK_S:
            seconds = self.profile.back_to_back_s(chars)  # its CPU quota partly spent (profile.py)
        else:
            seconds = self.profile.synthesis_s(chars)
        pod.running += 1
        self._work(("synthesis", pod.id, i), pod, seconds, self.v["pod.cpus"] / self.workers)

    def _work(self, key: tuple[str, int, int], pod: Pod, seconds: float, cores: float) -> None:
        self.owners[key] = pod
        self._timed(self.cores.start(self.now, key, seconds, cores))

    def _timed(self, finishes: list[Finish]) -> None:
        for t, key, version in finishes:
            self._push(t, _WORK, (key, version))

    def _finished(self, key: tuple[str, int, int], version: int) -> None:
        if not self.cores.current(key, version):
            return  # re-timed since this finish was scheduled
        self._timed(self.cores.end(self.now, key))
        pod = self.owners.pop(key)
        if key[0] == "synthesis":
            self._complete(pod, key[2])
        else:
            # The process is ready; the kubelet's probes see it at their next ticks, and the
            # interceptor or the activator a little later (PodTiming).
            assert pod.probes_s is not None
            assert pod.container_s is not None
            if self.flavour == "knative" and self.timing.startup_period_s <= 0:
                # No startup probe: the activator trusts its own probe of the pod (through
                # queue-proxy, which runs our readiness probe) before the kubelet's Ready.
                probe_s = self.v["kpa.activator_probe_s"]
                pod.ready_s = tick_at_or_after(self.now, probe_s, self.activator_phase)
            else:
                seen = tick_at_or_after(pod.container_s, self.v["pod.relist_s"], self.relist_phase)
                probed = self.timing.probed(self.now - pod.probes_s, seen - pod.probes_s)
                pod.ready_s = pod.probes_s + probed + self.timing.routed_s
            self._push(pod.ready_s, _READY, pod)

    def _container_started(self, pod: Pod) -> None:
        if pod.state != "starting":
            return  # scaled away before its container started
        pod.container_s = self.now
        self._work(_cold_start(pod), pod, self.timing.cold_start_s, self.v["pod.cpus"])

    def _pick_pod(self, http: bool = True) -> Pod | None:
        """The pod the next request goes to: a ready one, None where there is none. Knative's
        activator picks by its policy (_activator_pick; a full pod where none has a free slot: the
        request then waits), straight to the pods the least loaded. The KEDA interceptor sends to
        the Service through Go's keep-alive pool: it reuses the idle connection returned last
        (http.Transport takes the newest of a host's idle ones), else dials, and kube-proxy picks a
        ready pod at random for each new connection (seeded: a run is repeatable). A connection
        whose pod is gone or draining is dropped. Events come from the broker's own client: a ready
        pod at random."""
        if self.flavour == "keda":
            while http and self.idle:
                pod = self.idle.pop()
                if pod.state == "ready":
                    return pod
            ready = self._ready_pods()
            return self.random.choice(ready) if ready else None
        ready = self._ready_pods()
        if not ready:
            return None
        if self.activator_in_path:
            return self._activator_pick(sorted(ready, key=lambda p: p.address))
        return min(ready, key=lambda p: p.in_flight)

    def _activator_pick(self, ready: list[Pod]) -> Pod:
        """The activator's throttler over `ready` (sorted by address): for containerConcurrency
        1-3 the first with a free slot, above 3 round robin, at 0 the less loaded of two at random
        (lb_policy.go: firstAvailableLBPolicy, newRoundRobinPolicy, randomChoice2Policy)."""
        cc = self.v["kpa.container_concurrency"]
        if cc == 0:
            if len(ready) == 1:
                return ready[0]
            a, b = self.random.sample(ready, 2)
            return a if a.in_flight <= b.in_flight else b
        if cc <= 3:
            return next((p for p in ready if p.in_flight < cc), ready[0])
        if self.round_robin >= len(ready):
            self.round_robin = 0
        for step in range(len(ready)):
            k = (self.round_robin + step) % len(ready)
            if ready[k].in_flight < cc:
                self.round_robin = k + 1
                return ready[k]
        return ready[0]

    def _reject(self, i: int) -> None:
        self.done[i] = True
        self.rejected += 1
        self.in_system -= 1
        self._ended(i)

    def _ended(self, i: int) -> None:
        """Request i's caller has its answer (200, a refusal or a timeout). In a closed loop it sends
        its next request think_s later, unless that is past the trace's end."""
        if not self.trace.clients:
            return
        at = self.now + self.trace.think_s
        if at > self.trace.until_s:
            return
        # Non-decreasing: answers come in time order and every caller thinks as long.
        self.times.append(at)
        self.chars.append(self.chars[i])
        self.latency.append(None)
        self.forwarded.append(0.0)
        self.abandoned.append(False)
        self.done.append(False)
        self.is_event.append(self._is_event(len(self.times) - 1))

    def _is_event(self, i: int) -> bool:
        """Whether request i arrives as a CloudEvent through Kafka (keda.events_fraction of them, evenly)."""
        fraction = self.v["keda.events_fraction"]
        return self.flavour == "keda" and fraction > 0 and (i % (1 / fraction)) < 1

    def _dispatch(self) -> None:
        cap = self._capacity()
        if self.flavour == "keda" and len(self.held) > 1 and self._ready_pods():
            # The interceptor's waiting requests all wake when an endpoint is ready, each in its own
            # goroutine: they reach the pod in no particular order, not oldest first.
            self.random.shuffle(self.held)
        for queue, rejecting in ((self.held, self.full_pod_refuses), (self.kafka, False)):
            while queue:
                if not self._ready_pods():
                    return
                i = queue[0]
                waited = self.now - self.times[i]
                if (
                    queue is self.held
                    and self.flavour == "keda"
                    and waited > self.v["keda.http.wait_timeout_s"]
                ):
                    queue.popleft()  # the interceptor gave up on it (502)
                    self._reject(i)
                    continue
                pod = self._pick_pod(http=queue is self.held)
                if pod is None:
                    return
                if pod.in_flight >= cap:
                    if rejecting:
                        queue.popleft()
                        self._reject(i)
                        continue
                    break
                queue.popleft()
                self._assign(pod, i)

    # --- requests ------------------------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        self.in_system += 1
        self.arrivals_count += 1
        if self.flavour == "knative":
            self._push(self.now + self.v["kpa.revision_timeout_s"], _TIMEOUT, i)
        pod = self._pick_pod(http=not self.is_event[i])
        if self.flavour == "keda" and not self.is_event[i]:
            # The add-on's scaler streams the interceptor's activity to KEDA (external-push), so
            # every HTTP request counts as activity at once, not only those in flight at a poll.
            self.executor.last_active_s = self.now
        if self.flavour == "keda" and self.is_event[i]:
            self.kafka.append(i)
            if pod is None:
                self.cold_waits += 1
            self._dispatch()
            return
        if self.flavour == "knative" and pod is not None and not self.activator_in_path:
            self._knative_direct(i, pod)
            return
        if pod is not None and pod.in_flight < self._capacity() and not self.held:
            self._assign(pod, i)
            return
        if pod is not None and self.full_pod_refuses:
            self._reject(i)  # MAX_QUEUE full: 503 + Retry-After
            return
        if self.flavour == "knative" and len(self.held) >= ACTIVATOR_QUEUE:
            self._reject(i)  # the activator's queue is full: 503
            return
        if pod is None:
            self.cold_waits += 1
        self.held.append(i)
        if not self._active_pods():
            self._activate()

    def _time_out(self, i: int) -> None:
        """Knative's revision timeout for request i (see the module docstring), if it is still open."""
        if self.done[i]:
            return
        self.done[i] = True
        self.timed_out += 1
        self.in_system -= 1
        self._ended(i)
        if i in self.held:
            self.held.remove(i)
            return
        for pod in self.pods:
            if i in pod.queue:
                pod.queue.remove(i)
                if pod.state == "draining" and not pod.busy and not pod.queue:
                    self._gone(pod)
                self._dispatch()
                return
        self.abandoned[i] = True  # in synthesis: the pod finishes the engine call

    def _complete(self, pod: Pod, i: int) -> None:
        if not self.abandoned[i]:
            self.done[i] = True
            self.in_system -= 1
            lat = self.now - self.times[i]
            keda_http = self.flavour == "keda" and not self.is_event[i]
            if keda_http:
                # The add-on's scaler reports the host active while a request is in flight, so
                # KEDA's cooldown runs from the last answer, not the last arrival (tests/e2e/
                # test_calibration.py: a pod 8 s shorter-lived than the cluster's without this).
                self.executor.last_active_s = self.now
            if keda_http and self.now - self.forwarded[i] > self.v["keda.http.response_header_timeout_s"]:
                self.rejected += 1  # the interceptor stopped waiting for the headers: 502, work wasted
            else:
                self.latency[i] = lat
            self._ended(i)
        pod.running -= 1
        pod.last_end_s = self.now
        # The answer's connection goes back to the interceptor's pool, unless the pod has requests
        # waiting and says Connection: close (CLOSE_WHEN_BUSY). The pod decides as the answer
        # starts, while this request still counts as admitted: it closes if any other is there
        # beyond its workers' share, hence in_flight (which no longer counts this one) + 1.
        closes = self.v["pod.close_when_busy"] and pod.in_flight + 1 > self.workers
        if self.flavour == "keda" and not self.is_event[i] and pod.state == "ready" and not closes:
            self.idle.append(pod)
        # The predictor drops requests still queued after REQUEST_TIMEOUT_S (503).
        while pod.queue and self.now - self.forwarded[pod.queue[0]] > self.v["pod.request_timeout_s"]:
            self._reject(pod.queue.popleft())
        while pod.queue and pod.running < self.workers:
            self._synthesize(pod, pod.queue.popleft())
        if pod.state == "draining" and not pod.busy and not pod.queue:
            self._gone(pod)
        self._dispatch()

    # --- controllers ---------------------------------------------------------------------------
    def _setup(self) -> None:
        v = self.v
        if self.flavour == "knative":
            # As Knative's ResolveMetricTarget: a soft target above the hard limit is the hard limit.
            cc = v["kpa.container_concurrency"]
            target = (min(v["kpa.target"], cc) if cc > 0 else v["kpa.target"]) * v["kpa.target_utilization"]
            stable = v["kpa.stable_window_s"]
            self.decider = knative_kpa.Decider(
                knative_kpa.DeciderSpec(
                    target_value=target,
                    total_value=v["kpa.target"]
                    if v["kpa.container_concurrency"] == 0
                    else v["kpa.container_concurrency"],
                    target_burst_capacity=v["kpa.target_burst_capacity"],
                    panic_threshold=v["kpa.panic_threshold_pct"] / 100,
                    max_scale_up_rate=v["kpa.max_scale_up_rate"],
                    max_scale_down_rate=v["kpa.max_scale_down_rate"],
                    stable_window_s=stable,
                    scale_down_delay_s=v["kpa.scale_down_delay_s"],
                    activation_scale=v["kpa.activation_scale"],
                ),
                ready_pods_at_start=v["replicas.start"],
            )
            self.to_zero = knative_kpa.ScaleToZero(v["kpa.pod_retention_s"], v["kpa.scale_to_zero_grace_s"])
            self.tick_s = knative_kpa.TICK_S
            self.stable_n = max(1, round(stable / self.tick_s))
            self.panic_n = max(1, round(stable * v["kpa.panic_window_pct"] / 100 / self.tick_s))
            self.history: deque[tuple[float, float, int]] = deque(maxlen=self.stable_n + 1)
        else:
            self.triggers = keda.Triggers(
                v["keda.prom.threshold"],
                v["keda.prom.activation"],
                v["keda.http.target"],
                v["keda.kafka.lag_threshold"],
                v["keda.kafka.activation"],
            )
            self.executor = keda.Executor(v["keda.cooldown_s"], v["keda.initial_cooldown_s"], self.min_pods)
            if v["replicas.start"] > 0:
                # Pods running when the trace starts were asked for by traffic just before it: the
                # cooldown runs from now, not from long ago.
                self.executor.last_active_s = 0.0
            self.behavior = hpa.Behavior(
                _rules(v, "hpa.scale_up"), _rules(v, "hpa.scale_down"), max(1, self.min_pods), self.max_pods
            )
            self.tick_s = v["keda.polling_interval_s"]
            self.queue_depth: float | None = None
            self._push(0.0, _SCRAPE)
            self._push(v["hpa.first_sync_s"], _HPA)
        for at, cpus in settings.cpus_over_time(v["node.cpus_over_time"]):
            self._push(at, _NODE, cpus)
        self._push(0.0, _TICK)
        self._scale_to(v["replicas.start"])
        for pod in self.pods:  # already running when the trace starts
            pod.state, pod.ready_s = "ready", 0.0
        if len(self.pods) >= 2:
            self.second_ready_s = 0.0

    def _activate(self) -> None:
        """A request at zero starts pods: the activator's poke (Knative) at once; the HTTP add-on's
        scaler (KEDA) at its next push after its next ping of the interceptors' counts."""
        if self.flavour == "knative":
            self.to_zero.zero_since = None
            self._scale_to(max(1, self.v["kpa.activation_scale"]))
        elif self.ping_at is None:
            # The scaler counts the request at its next ping of the interceptors and tells KEDA at
            # its stream's next send after that (kedacore/http-add-on scaler: queue_pinger.go pings
            # every KEDA_HTTP_QUEUE_TICK_DURATION, StreamIsActive sends every
            # KEDA_HTTP_SCALER_STREAM_INTERVAL_MS); KEDA's own poll sees it from the ping on.
            self.ping_at = tick_at_or_after(self.now, self.v["keda.http.queue_tick_s"], self.ping_phase)
            push_at = tick_at_or_after(self.ping_at, self.v["keda.http.stream_interval_s"], self.stream_phase)
            self._push(push_at, _PUSH)

    def _keda_pushed(self) -> None:
        self.ping_at = None
        if self._active_pods():
            return  # KEDA's poll saw the ping's count first
        target = self.executor.decide(self.now, True, len(self._active_pods()))
        if target is not None:
            self._scale_to(target)

    def _kpa_tick(self) -> None:
        self.history.append((self.now, self.conc_integral, self.arrivals_count))
        t0, c0, a0 = self.history[0]
        span = max(self.now - t0, self.tick_s)
        pi = max(0, len(self.history) - 1 - self.panic_n)
        tp, cp, ap = self.history[pi]
        pspan = max(self.now - tp, self.tick_s)
        if self.v["kpa.metric"] == "rps":
            stable, panic = (self.arrivals_count - a0) / span, (self.arrivals_count - ap) / pspan
        else:
            stable, panic = (self.conc_integral - c0) / span, (self.conc_integral - cp) / pspan
        ready = len(self._ready_pods())
        result = self.decider.scale(self.now, ready, stable, panic)
        desired = max(self.min_pods, min(self.max_pods, result.desired_pod_count))
        if self.held:  # the activator holds requests: the revision is activating, never zero
            desired = max(desired, 1)
        proxy_for = self.now - self.proxy_since if self.activator_in_path else 0.0
        desired = self.to_zero.apply(self.now, desired, proxy_for) if self.min_pods == 0 else desired
        if desired == 1 and not self._active_pods() and not self.held:
            desired = 0  # already at zero and nothing asks for a pod: stay there
        self._scale_to(desired)
        # kpa.go: Serve mode (the activator out of the path) when scaled above zero with excess
        # burst capacity; Proxy mode otherwise.
        in_path = not (desired > 0 and result.excess_burst_capacity >= 0)
        if in_path and not self.activator_in_path:
            self.proxy_since = self.now
        self.activator_in_path = in_path

    def _keda_poll(self) -> None:
        http = self._http_concurrency()
        if self.ping_at is not None and self.ping_at > self.now:
            http = 0  # requests held at zero that the scaler has not counted yet
        active = self.triggers.active(self.queue_depth, http, len(self.kafka))
        target = self.executor.decide(self.now, active, len(self._active_pods()))
        if target is not None:
            self._scale_to(target)

    def _http_concurrency(self) -> float:
        return len(self.held) + sum(p.in_flight for p in self.pods if p.state != "gone")

    def _hpa_sync(self) -> None:
        current = len(self._active_pods())
        if current == 0:
            return  # KEDA sets replicas to 0 and the HPA is idle at zero
        proposals = [
            hpa.per_pod_replicas(usage, target, current, self.v["hpa.tolerance"])
            for usage, target in self.triggers.metrics(
                self.queue_depth, self._http_concurrency(), len(self.kafka)
            )
        ]
        desired = max(proposals, default=current)
        self._scale_to(self.behavior.normalize(current, desired, self.now))

    def _sample(self) -> None:
        tl = self.timeline
        tl.t.append(self.now)
        tl.ready.append(sum(1 for p in self.pods if p.state == "ready"))
        tl.starting.append(sum(1 for p in self.pods if p.state == "starting"))
        tl.waiting.append(len(self.held) + len(self.kafka) + sum(len(p.queue) for p in self.pods))

    # --- loop ----------------------------------------------------------------------------------
    def run(self) -> Result:
        times = self.times  # grows as a closed loop's callers send again (_ended)
        self.is_event = [self._is_event(i) for i in range(len(times))]
        last = max(times[-1] if times else 0.0, self.trace.until_s if self.trace.clients else 0.0)
        horizon = last + 3600.0  # an hour after the last arrival, to see idle cost
        sample_s = max(1.0, horizon / 4000)
        self._setup()
        self._push(0.0, _SAMPLE)
        nxt = 0
        events = self.events
        while True:
            if nxt < len(times) and (not events or times[nxt] <= events[0][0]):
                self._advance(times[nxt])
                self._arrive(nxt)
                nxt += 1
                continue
            if not events:
                break
            t, _, kind, data = heapq.heappop(events)
            if t > horizon and nxt >= len(times):
                break
            self._advance(t)
            if kind == _WORK:
                self._finished(*data)
            elif kind == _CONTAINER:
                self._container_started(data)
            elif kind == _READY:
                if data.state == "starting":
                    data.state = "ready"
                    if self.second_ready_s is None and len(self._ready_pods()) >= 2:
                        self.second_ready_s = self.now
                    self._dispatch()
            elif kind == _TICK:
                if self.flavour == "knative":
                    self._kpa_tick()
                else:
                    self._keda_poll()
                self._push(t + self.tick_s, _TICK)
            elif kind == _SCRAPE:
                ready = [p for p in self.pods if p.state != "gone"]
                self.queue_depth = float(sum(len(p.queue) for p in ready)) if ready else None
                self._push(t + self.v["keda.scrape_s"], _SCRAPE)
            elif kind == _HPA:
                self._hpa_sync()
                self._push(t + self.v["hpa.sync_s"], _HPA)
            elif kind == _SAMPLE:
                self._sample()
                self._push(t + sample_s, _SAMPLE)
            elif kind == _TIMEOUT:
                self._time_out(data)
            elif kind == _PUSH:
                self._keda_pushed()
            elif kind == _NODE:
                self._timed(self.cores.resize(self.now, data))
        # Whatever is still held at the end never got an answer.
        for _ in range(len(self.held) + len(self.kafka)):
            self.rejected += 1
        return Result(
            self.flavour,
            times,
            self.latency,
            self.cold_waits,
            self.rejected,
            self.timed_out,
            self.pod_seconds,
            self.max_replicas,
            self.pod_starts,
            self.now,
            self.timeline,
            self.second_ready_s,
        )


def _cold_start(pod: Pod) -> tuple[str, int, int]:
    """The key of a pod's cold start among the node's work (a synthesis's is ("synthesis", pod, i))."""
    return ("cold start", pod.id, 0)


def _rules(v: dict[str, Any], prefix: str) -> hpa.Rules:
    from tts_ops.simulate.errors import SimulateError

    policies = []
    for item in filter(None, str(v[f"{prefix}.policies"]).split(",")):
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in ("Pods", "Percent"):
            raise SimulateError(
                f"{prefix}.policies: {item!r} is not TYPE:VALUE:PERIOD (TYPE Pods or Percent)"
            )
        try:
            policies.append(hpa.Policy(parts[0], int(parts[1]), int(parts[2])))
        except ValueError:
            raise SimulateError(f"{prefix}.policies: {item!r}: VALUE and PERIOD are integers") from None
    select = v[f"{prefix}.select"]
    if select not in ("Max", "Min", "Disabled"):
        raise SimulateError(f"{prefix}.select: {select!r} is not Max, Min or Disabled")
    return hpa.Rules(v[f"{prefix}.window_s"], policies, select)


def simulate(flavour: str, values: dict[str, Any], profile: Profile, trace: Trace) -> Result:
    return Simulation(flavour, values, profile, trace).run()
