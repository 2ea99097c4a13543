"""A trace replayed through a flavour's real path on the local cluster, measured as the simulator
measures it (issue 22's calibration, tests/e2e/test_calibration.py).

Open loop: each request leaves at its trace time whatever the others are doing, as the simulator's
arrivals do. A watcher lists the stable predictor's pods every `SAMPLE_S` from the first send until
the flavour is back at zero, which gives the replicas over time. The figures are the simulator's
summary keys, defined the same way on both sides:

- latency p50/p99: over answered (200) requests, send to last byte;
- max replicas: the most pods at once that the autoscaler kept (not being deleted);
- replica-seconds: the integral of those pods from the first send until none is left;
- cold-start waits: requests sent while no pod could take one (the simulator's "no ready pod at
  arrival"): sent before the first answer less one synthesis (`service_s`, the profile's), which is
  when the held requests reached the first pod. Not the pods' Ready as the watcher samples it: a
  sample every ~1.2 s (kubectl and /proc take most of SAMPLE_S) marks it up to that much late, and
  Knative's activator routes on its own probe before the kubelet's Ready.

Where an HPA scales the pods (the keda flavour), its status updates are watched too (`hpa_updates`):
only the HPA controller writes an HPA's status, at the end of a sync that changed it, so they mark
when it syncs (every 15 s, at a phase set when the HPA was made).

The node's CPU is sampled with the pods (`cpu`): all of it (/proc/stat: the node runs on this
machine's kernel) and the stable pods' processes' own (found by their pod uid in /proc/PID/cgroup).
What the rest took (the control plane, the data path, this replay and its watcher's kubectl) is
`others_cores`: the simulator is given the cores it left to the predictor pods (node.cpus).

A pod being deleted is not counted: the simulator removes a pod when it is scaled down (an idle one
at once, a busy one after its queue), and its termination (queue-proxy's drain, the grace period) is
outside both models of autoscaling."""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from testing.bodies import v2_request
from testing.kube import INFER, NAMESPACE, Cluster, at_zero, eventually, ready, stable_pods

SAMPLE_S = 0.5


@dataclass
class Replay:
    sends: list[float]  # seconds after the first scheduled send
    latency: list[float | None]  # None: not answered 200
    status: list[int]  # 0: no response (a transport error)
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, pods kept, ready)
    cold_start_s: dict[str, float] = field(default_factory=dict)  # each pod's, from its log once ready
    cpu: list[tuple[float, float, float]] = field(default_factory=list)  # (t, node busy s, pods' s), summed
    started: float = 0.0  # epoch seconds of the first scheduled send: the other times count from it
    hpa_updates: list[float] = field(default_factory=list)  # the HPA's status writes, as `sends`

    def _answered_at(self) -> list[float]:
        """When each request answered 200 came back, as `sends`."""
        return [s + x for s, x in zip(self.sends, self.latency, strict=True) if x is not None]

    def _until_s(self) -> float:
        """The last answer (the last send when none came): the end of what the node's CPU is read over."""
        return max(self._answered_at(), default=self.sends[-1] if self.sends else 0.0)

    def others_cores(self) -> float:
        """Cores the node spent outside the stable pods, on average, from the first send until the
        last answer."""
        span = [c for c in self.cpu if c[0] <= self._until_s()]
        if len(span) < 2 or span[-1][0] <= span[0][0]:
            return 0.0
        return max(0.0, _others(span[0], span[-1]))

    def spare_cores_over_time(self, cores: float) -> list[tuple[float, float]]:
        """(from seconds, cores) the rest of the node left to the stable pods between each two CPU
        samples, from the first send until the last answer: `cores` less what the rest took then."""
        end = self._until_s()
        steps = []
        for a, b in itertools.pairwise(self.cpu):
            if a[0] > end or b[0] <= a[0]:
                break
            # At least a tenth of a core: 0 would mean no limit (node.cpus).
            steps.append((round(a[0], 2), round(min(cores, max(0.1, cores - _others(a, b))), 2)))
        return steps

    def first_cold_start_s(self) -> float:
        """The cold start of the pod started from zero, beside nothing else of ours (the first ready)."""
        return next(iter(self.cold_start_s.values()))

    def alone_cold_start_s(self) -> float | None:
        """The first pod's cold start if no other pod was kept until it was ready (a pod of ours
        starting beside nothing else of ours), else None."""
        for _t, kept, ready_n in self.samples:
            if ready_n:
                return self.first_cold_start_s() if kept == 1 else None
            if kept > 1:
                return None
        return None

    def first_served_s(self, service_s: float) -> float | None:
        """When the first pod took its first request: the first answer, less the synthesis it took."""
        answered = self._answered_at()
        return min(answered) - service_s if answered else None

    def summary(self, service_s: float) -> dict[str, Any]:
        """The simulator's summary keys; `service_s`: one request's synthesis on a pod (the profile's)."""
        from tts_ops.simulate.simulator import percentile

        done = sorted(x for x in self.latency if x is not None)
        served = self.first_served_s(service_s)
        seconds = 0.0
        for (t0, kept, _), (t1, _, _) in zip(self.samples, self.samples[1:], strict=False):
            seconds += kept * (t1 - t0)
        return {
            "requests": len(self.sends),
            "completed": len(done),
            "latency_p50_s": percentile(done, 0.50),
            "latency_p99_s": percentile(done, 0.99),
            "max_replicas": max((k for _, k, _ in self.samples), default=0),
            "replica_seconds": round(seconds, 1),
            "cold_start_waits": sum(1 for t in self.sends if served is None or t < served),
            "answers": {str(c): self.status.count(c) for c in sorted(set(self.status))},
        }


def _others(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """Cores the node spent outside the stable pods between CPU samples a and b (t, busy, pods' own)."""
    return ((b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0])


_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _node_busy_s() -> float:
    """CPU seconds the machine has spent busy since boot, all cores (/proc/stat: not idle or iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) * _TICK_S


class _PodCpu:
    """The CPU seconds the processes of given pods have used, summed over every process seen: a pod
    gone at zero keeps what its processes used while it lived."""

    def __init__(self) -> None:
        self._last: dict[int, float] = {}
        self.total = 0.0

    def sample(self, uids: set[str]) -> float:
        # The kubelet names a pod's cgroup pod<uid> (cgroupfs) or ...pod<uid with _>.slice (systemd).
        marks = {f"pod{u}" for u in uids} | {f"pod{u.replace('-', '_')}" for u in uids}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()
                if not any(m in cgroup for m in marks):
                    continue
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            fields = stat[stat.rindex(")") + 2 :].split()
            used = (int(fields[11]) + int(fields[12])) * _TICK_S
            self.total += used - self._last.get(pid, 0.0)
            self._last[pid] = used
        return self.total


def replay(
    cluster: Cluster, url: str, host: str, times: list[float], text: str, to_zero_s: float = 300
) -> Replay:
    """Send `text` as a v2 request at each of `times` (seconds) through `url` with Host `host`, from
    zero, and watch the pods until the flavour is back at zero (at most `to_zero_s` after the last
    answer)."""
    assert at_zero(cluster), "a replay starts at zero"
    n = len(times)
    result = Replay(sends=list(times), latency=[None] * n, status=[0] * n)
    done = threading.Event()
    client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))

    def send(i: int) -> None:
        delay = started + times[i] - time.time()
        if delay > 0:
            time.sleep(delay)
        sent = time.time()
        result.sends[i] = sent - started
        try:
            response = client.post(
                url + INFER.format(model_name="tts"), headers={"Host": host}, json=v2_request(text)
            )
        except httpx.HTTPError:
            return
        result.status[i] = response.status_code
        if response.status_code == 200:
            result.latency[i] = time.time() - sent

    pod_cpu = _PodCpu()
    uids: set[str] = set()
    busy_at_start = _node_busy_s()

    def watch() -> None:
        while True:
            pods = stable_pods(cluster)
            uids.update(p["metadata"]["uid"] for p in pods)
            result.cpu.append((time.time() - started, _node_busy_s() - busy_at_start, pod_cpu.sample(uids)))
            kept = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            for pod in kept:
                name = pod["metadata"]["name"]
                if ready(pod) and name not in result.cold_start_s:
                    # Read while the pod lives: at zero its log is gone.
                    result.cold_start_s[name] = cluster.model_ready(NAMESPACE, name)["cold_start_s"]
            result.samples.append((time.time() - started, len(kept), sum(1 for p in kept if ready(p))))
            if done.is_set() and not kept:
                return
            time.sleep(SAMPLE_S)

    started = result.started = time.time()
    watcher = threading.Thread(target=watch)
    watcher.start()
    hpa_watch = _watch_hpa_status(cluster, result)
    senders = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join(times[-1] + 180 if times else 180)
    client.close()
    done.set()
    watcher.join(to_zero_s)
    hpa_watch.terminate()
    hpa_watch.wait(10)
    assert not watcher.is_alive(), f"not back at zero {to_zero_s:.0f} s after the last answer"
    eventually("zero replicas", lambda: at_zero(cluster), to_zero_s)
    return result


def _watch_hpa_status(cluster: Cluster, result: Replay) -> subprocess.Popen:
    """`kubectl get hpa --watch-only` in the namespace: the arrival time of each event (one line each,
    the HPA controller's status writes) goes to result.hpa_updates. None arrive without an HPA."""
    proc = subprocess.Popen(
        [cluster.kubectl_path, f"--kubeconfig={cluster.kubeconfig}", "-n", NAMESPACE, "get", "hpa",
         "--watch-only", "-o", "jsonpath={.metadata.name}{'\\n'}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip

    def read() -> None:
        assert proc.stdout is not None
        for _line in proc.stdout:
            result.hpa_updates.append(time.time() - result.started)

    threading.Thread(target=read, daemon=True).start()
    return proc
