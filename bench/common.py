"""Shared plumbing for the benchmarks: the session's services, the predictor, results.

Every service a benchmark needs runs as a child process (testing.process) on a free 127.0.0.1 port and
is registered on one ExitStack, so it is stopped at the end whatever happens (error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testing.predictor import PredictorProcess
from testing.process import Child
from testing.s3 import MotoServer, aws_env, build_voice, publish_voice

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
VOICE_URI = "s3://bench-voices/en_US-joe-medium"
SENTENCE = "The quick brown fox jumps over the lazy dog."
# Same params everywhere: deterministic synthesis, so every run does the same work.
PARAMS = {"noise_scale": 0.0, "noise_w": 0.0}
THREADS = 2  # engine intra-op threads, for the server (CPU_THREADS) and the in-process engine alike
# A pause before each timed request that alternates with another server or runtime, so it starts on a
# quiet machine: work does not end with an answer (Piper's onnxruntime pool spins on after each run:
# about 30 ms of its CPU in the 40 ms after an answer, sampled from /proc), and without the pause the
# next timed request, the other side's, shared the two CPUs with it (ours after Piper's server: 93 ms
# for 26 characters, 69 ms after our own; docs/benchmarks.md, "A fair lone request").
SETTLE_S = 0.1


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


def settle() -> None:
    """SETTLE_S of quiet before a timed request that alternates with another side's."""
    time.sleep(SETTLE_S)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value; with 50 samples p99 is the maximum."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
        """A child process with its log under the session, stopped when the session ends."""
        child = Child(name, argv, env, self.path("logs") / f"{name}.log")
        self.stack.callback(child.stop)
        return child

    @property
    def moto(self) -> str:
        """Endpoint of a moto S3 server (started on first use)."""
        if self._moto is None:
            server = MotoServer(self.path("logs") / "moto.log")
            self.stack.callback(server.stop)
            log(f"moto S3 on {server.endpoint}")
            # boto3 in this process (publishing, uploading) talks to moto with its dummy credentials.
            os.environ.update(aws_env(server.endpoint))
            self._moto = server.endpoint
        return self._moto

    @property
    def voice(self) -> str:
        """URI of the default voice artifact published to moto (published on first use)."""
        if self._voice is None:
            self._voice = publish_voice(build_voice(self.path("voice")), VOICE_URI, self.moto)
            log(f"published the default voice to {VOICE_URI}")
        return self._voice


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --- the predictor as a real process ---------------------------------------------------------
class Predictor(PredictorProcess):
    """A predictor serving the session's published voice from ``model_dir``; stopped with the session."""

    def __init__(self, session: Session, model_dir: Path, cwd: Path | None = None, **env: str):
        full = {
            **aws_env(session.moto),
            "VOICE_URI": session.voice,
            "MODEL_DIR": str(model_dir),
            "CPU_THREADS": str(THREADS),
            "LOG_FORMAT": "json",
            **env,
        }
        super().__init__(full, session.path("logs") / "predictor.log", **({"cwd": cwd} if cwd else {}))
        session.stack.callback(self.stop)

    def wait_ready(self, timeout: float = 180.0, interval: float = 0.01) -> float:
        """Seconds from Popen to the first 200 on the model's ready route (polled every 10 ms)."""
        return super().wait_ready(timeout, interval)

    def cold_start_metrics(self) -> dict[str, float]:
        """tts_cold_start_seconds{phase}."""
        return self.samples("tts_cold_start_seconds", "phase")

    def engine_seconds(self) -> tuple[float, float]:
        """(sum, count) of tts_synthesis_seconds: the server's own engine time per request."""
        s = self.samples("tts_synthesis_seconds")
        return s.get("tts_synthesis_seconds_sum", 0.0), s.get("tts_synthesis_seconds_count", 0.0)

    def ready_log(self) -> dict[str, Any] | None:
        """The "model ready" JSON log line, if the predictor wrote one."""
        for line in self.logs().splitlines():
            if '"model ready"' in line:
                try:
                    return json.loads(line)
                except ValueError:
                    return None
        return None
