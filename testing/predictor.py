"""`python -m predictor` as a real process: `serve` on its own ports, and the one-shot commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from testing.ports import free_port
from testing.process import REPO, Child, child_env

SERVE = [sys.executable, "-m", "predictor", "serve"]


def metric(url: str, name: str, **labels: str) -> float:
    """Value of the one sample ``name`` with these labels from the /metrics of the predictor at ``url``
    (0 when absent)."""
    return metric_in(httpx.get(url + "/metrics", timeout=5).text, name, **labels)


def metric_in(exposition: str, name: str, **labels: str) -> float:
    """Value of the one sample ``name`` with these labels in a /metrics page's text (0 when absent)."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


class PredictorProcess(Child):
    """`python -m predictor serve` on free ports (unless given), its output in ``log_path``.

    ``get``/``post`` open a fresh connection per call, as independent clients do; ``client`` is one
    persistent connection, the one the readiness poll opens (a first request after ready reuses it).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path | None,
        *,
        http_port: int | None = None,
        grpc_port: int | None = None,
        name: str = "predictor",
        user: int | None = None,
        cwd: Path = REPO,
    ) -> None:
        """``cwd``: the checkout whose ``predictor`` runs (``python -m`` puts it first on the path,
        before PYTHONPATH), for a tree compared with this one."""
        self.http_port = http_port or free_port()
        self.grpc_port = grpc_port or free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"
        self.env = child_env({"HTTP_PORT": str(self.http_port), "GRPC_PORT": str(self.grpc_port), **env})
        self.client = httpx.Client(base_url=self.url, timeout=60)
        super().__init__(name, SERVE, self.env, log_path, cwd=cwd, user=user)

    def get(self, path: str, timeout: float = 5.0) -> httpx.Response:
        return httpx.get(self.url + path, timeout=timeout)

    def post(self, path: str, timeout: float = 60.0, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=timeout, **kwargs)

    def stream(self, path: str, timeout: float = 120.0, **kwargs: Any) -> ContextManager[httpx.Response]:
        """A streamed POST on a fresh connection: ``with p.stream(path, json=...) as response``."""
        return httpx.stream("POST", self.url + path, timeout=timeout, **kwargs)

    def wait_live(self, timeout: float = 60.0) -> None:
        self.wait_for(lambda: self.get("/v2/health/live").status_code == 200, timeout, "live")

    def wait_ready(self, timeout: float = 120.0, interval: float = 0.05) -> float:
        """Seconds from Popen to the first 200 on the model's ready route."""
        self.wait_for(
            lambda: self.client.get("/v2/models/tts/ready", timeout=2).status_code == 200,
            timeout,
            "model ready",
            interval,
        )
        return time.perf_counter() - self.started

    def wait_for_copies(self, timeout: float = 120.0) -> None:
        """Until the engine's other copies exist: made after ready (the workers' with ENGINE_WORKERS > 1,
        the lanes' with two CPU threads or more), with every CPU, so nothing timed or compared should
        run beside them."""
        self.wait_for(
            lambda: self.metric("tts_cold_start_seconds", phase="copies") > 0,
            timeout,
            "the engine's other copies",
            0.05,
        )

    def samples(self, name: str, label: str | None = None) -> dict[str, float]:
        """Samples from /metrics whose name starts with ``name``, keyed by ``label``'s value (or name)."""
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for s in family.samples:
                if s.name.startswith(name):
                    out[s.labels[label] if label else s.name] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Value of the one sample ``name`` with these labels from /metrics (0 when absent)."""
        return metric(self.url, name, **labels)

    def stop(self, grace_s: float = 30.0) -> int:
        # Longer than a plain child's: the drain on SIGTERM may take DRAIN_TIMEOUT_S.
        self.client.close()
        return super().stop(grace_s)


def run_synth(model_dir: Path, text: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m predictor synth` from ``model_dir`` without noise (the same audio every time)."""
    quiet = ["--noise-scale", "0", "--noise-w", "0"]
    return run_cli("synth", "--model-dir", str(model_dir), *quiet, "--text", text, "--out", str(out), *args)


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120, module: str = "predictor"
) -> subprocess.CompletedProcess[str]:
    """`python -m predictor ARGS` (or ``module``: `tts_ops` for the offline tools) to completion in
    this environment plus ``env``, output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def not_json_lines(log: str) -> list[str]:
    """The non-empty lines of a JSON-mode predictor's output (stderr and stdout) that are not JSON objects."""
    bad = []
    for line in log.splitlines():
        if not line.strip():
            continue
        try:
            if isinstance(json.loads(line), dict):
                continue
        except ValueError:
            pass
        bad.append(line)
    return bad
