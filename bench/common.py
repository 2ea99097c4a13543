"""Shared plumbing for the benchmarks: ports, child processes, local S3, the predictor, results.

Every service a benchmark needs runs as a child process on a free 127.0.0.1 port and is registered
on one ExitStack, so it is stopped at the end whatever happens (error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
VOICE_URI = "s3://bench-voices/en_US-joe-medium"
SENTENCE = "The quick brown fox jumps over the lazy dog."
# Same params everywhere: deterministic synthesis, so every run does the same work.
PARAMS = {"noise_scale": 0.0, "noise_w": 0.0}
THREADS = 2  # engine intra-op threads, for the server (CPU_THREADS) and the in-process engine alike


# --- results ---------------------------------------------------------------------------------
@dataclass
class Row:
    """One line of the result table: a measurement, its same-run baseline and their ratio."""

    suite: str
    name: str
    value: float
    unit: str
    baseline_name: str = ""
    baseline: float | None = None
    ratio: float | None = None  # value / baseline, or a difference where ratio_label says so
    ratio_label: str = "x"
    goal: str = ""
    met: bool | None = None
    note: str = ""


@dataclass
class SuiteResult:
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "details": self.details, "notes": self.notes}


def failed_sample(status: int, body_bytes: int) -> str | None:
    """Why a timed sample does not count, or None: a non-200 or an empty body is a failure, never a
    fast answer (an error body would otherwise pass for a quick first packet)."""
    if status != 200:
        return f"status {status}"
    if body_bytes == 0:
        return "empty body"
    return None


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value; with 50 samples p99 is the maximum."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- processes -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Child:
    """A child process with its output in a log file; stop() is SIGTERM, then SIGKILL after a grace."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, grace_s: float = 15.0) -> int:
        """SIGTERM, SIGKILL after `grace_s`; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def wait_until(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    child: Child | None = None,
    interval_s: float = 0.05,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(
                f"{child.name} exited ({child.proc.returncode}) before {what}:\n{child.logs()[-3000:]}"
            )
        try:
            if check():
                return
        except (httpx.TransportError, OSError):
            pass
        time.sleep(interval_s)
    tail = child.logs()[-3000:] if child else ""
    raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}\n{tail}")


def aws_env(endpoint: str) -> dict[str, str]:
    """Standard AWS variables pointing boto3 at ``endpoint``; moto accepts any credentials."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # A developer's ~/.aws config or profile must not leak into the measurement.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment without AWS/OTEL/predictor settings of our own shell, plus ``extra``."""
    drop = ("AWS_", "OTEL_", "S3_", "STORAGE_", "MODEL_", "FETCH_", "CPU_", "HTTP_PORT", "GRPC_PORT")
    base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**base, **extra}


# --- the session: services shared by the suites ----------------------------------------------
class Session:
    """Temp workspace plus lazily started shared services (moto, the published voice)."""

    def __init__(self, stack: ExitStack):
        self.stack = stack
        self.tmp = Path(tempfile.mkdtemp(prefix="tts-bench-"))
        stack.callback(_rmtree, self.tmp)
        self._moto: str | None = None
        self._voice: str | None = None

    def path(self, name: str) -> Path:
        p = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.tmp))
        return p

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        child = Child(name, argv, env, self.path("logs") / f"{name}.log")
        self.stack.callback(child.stop)
        return child

    @property
    def moto(self) -> str:
        """Endpoint of a moto S3 server (started on first use)."""
        if self._moto is None:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            child = self.start(
                "moto", [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], child_env({})
            )
            wait_until(lambda: httpx.get(url + "/", timeout=1).status_code < 600, 60, "moto", child)
            log(f"moto S3 on {url}")
            # boto3 in this process (publishing, uploading) talks to moto with its dummy credentials.
            os.environ.update(aws_env(url))
            self._moto = url
        return self._moto

    @property
    def voice(self) -> str:
        """URI of the default voice artifact published to moto (published on first use)."""
        if self._voice is None:
            from predictor.artifact.publish import build_default_voice, publish

            src = self.path("voice")
            build_default_voice(src)
            publish(src, VOICE_URI, endpoint_url=self.moto)
            log(f"published the default voice to {VOICE_URI}")
            self._voice = VOICE_URI
        return self._voice


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --- the predictor as a real process ---------------------------------------------------------
class Predictor:
    """`python -m predictor serve` on free ports; exec->ready measured from the parent."""

    def __init__(self, session: Session, model_dir: Path, **env: str):
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        full = child_env(
            {
                **aws_env(session.moto),
                "STORAGE_URI": session.voice,
                "MODEL_DIR": str(model_dir),
                "HTTP_PORT": str(self.http_port),
                "GRPC_PORT": str(free_port()),
                "CPU_THREADS": str(THREADS),
                "LOG_FORMAT": "json",
                **env,
            }
        )
        self.client = httpx.Client(base_url=self.url, timeout=60)
        self.child = session.start("predictor", [PYTHON, "-m", "predictor", "serve"], full)
        self.started = self.child.started

    def wait_ready(self, timeout_s: float = 180.0, interval_s: float = 0.01) -> float:
        """Seconds from Popen to the first 200 on the model's ready route (polled every 10 ms)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.child.alive():
                raise RuntimeError(
                    f"predictor exited ({self.child.proc.returncode}):\n{self.child.logs()[-3000:]}"
                )
            try:
                if self.client.get("/v2/models/tts/ready", timeout=2).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.TransportError:
                pass
            time.sleep(interval_s)
        raise RuntimeError(f"predictor not ready after {timeout_s}s:\n{self.child.logs()[-3000:]}")

    def samples(self, name: str, label: str | None = None) -> dict[str, float]:
        """Samples of one metric from /metrics, keyed by ``label``'s value (or by sample name)."""
        from prometheus_client.parser import text_string_to_metric_families

        out = {}
        for family in text_string_to_metric_families(self.client.get("/metrics").text):
            for s in family.samples:
                if s.name.startswith(name):
                    out[s.labels[label] if label else s.name] = s.value
        return out

    def cold_start_metrics(self) -> dict[str, float]:
        """tts_cold_start_seconds{phase}."""
        return self.samples("tts_cold_start_seconds", "phase")

    def engine_seconds(self) -> tuple[float, float]:
        """(sum, count) of tts_synthesis_seconds: the server's own engine time per request."""
        s = self.samples("tts_synthesis_seconds")
        return s.get("tts_synthesis_seconds_sum", 0.0), s.get("tts_synthesis_seconds_count", 0.0)

    def ready_log(self) -> dict[str, Any] | None:
        """The "model ready" JSON log line, if the predictor wrote one."""
        for line in self.child.logs().splitlines():
            if '"model ready"' in line:
                try:
                    return json.loads(line)
                except ValueError:
                    return None
        return None

    def stop(self) -> None:
        self.client.close()
        self.child.stop()
