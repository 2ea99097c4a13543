"""Shared fixtures: a real S3 (moto_server on a local port) and the default voice published to it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.common import Child, wait_until
from predictor.artifact.publish import build_default_voice, publish

VOICE_URI = "s3://voices/en_US-joe-medium"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def aws_env_for(endpoint: str) -> dict[str, str]:
    """The standard AWS variables pointing boto3 at ``endpoint`` with moto's dummy credentials."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # Keep a developer's real ~/.aws config and profile out of the tests.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


def _apply_aws_env(mp: pytest.MonkeyPatch, endpoint: str) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        mp.delenv(name, raising=False)
    for name, value in aws_env_for(endpoint).items():
        mp.setenv(name, value)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server in a subprocess on a free local port; yields its endpoint URL."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode}: {log_path.read_text()}")
            try:
                urllib.request.urlopen(f"{endpoint}/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # any HTTP answer means it is serving
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not answer on {endpoint}") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point boto3 (through the standard AWS_* variables) at the moto server; returns the endpoint."""
    _apply_aws_env(monkeypatch, s3_server)
    return s3_server


@pytest.fixture(scope="session")
def voice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default voice laid out as an artifact (files + manifest.json) in a session temp dir."""
    out = tmp_path_factory.mktemp("voice")
    build_default_voice(out)
    return out


@pytest.fixture(scope="session")
def published_voice(s3_server: str, voice_dir: Path) -> str:
    """The default voice published to the moto server; returns its s3:// URI."""
    with pytest.MonkeyPatch.context() as mp:
        _apply_aws_env(mp, s3_server)
        publish(voice_dir, VOICE_URI)
    return VOICE_URI


# --- the predictor as a real process ---------------------------------------------------------
# A credential value that must never show up in a log line or metric.
SECRET = "never-log-this-secret-0123456789"


class PredictorProcess(Child):
    """`python -m predictor serve` on free ports, with its log captured to a file."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.http_port, self.grpc_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"
        full_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "OTEL_"))},
            "HTTP_PORT": str(self.http_port),
            "GRPC_PORT": str(self.grpc_port),
            "CPU_THREADS": "1",  # two predictors may share CI's two cores
            **env,
        }
        self.env = full_env
        super().__init__("predictor", [sys.executable, "-m", "predictor", "serve"], full_env, log_path)

    def get(self, path: str, timeout: float = 5.0) -> httpx.Response:
        return httpx.get(self.url + path, timeout=timeout)

    def post(self, path: str, timeout: float = 60.0, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=timeout, **kwargs)

    def wait_live(self, timeout: float = 60.0) -> None:
        self._wait(lambda: self.get("/v2/health/live").status_code == 200, timeout, "live")

    def wait_ready(self, timeout: float = 120.0) -> None:
        self._wait(lambda: self.get("/v2/models/tts/ready").status_code == 200, timeout, "ready")

    def _wait(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"predictor exited ({self.proc.returncode}) before {what}:\n{self.logs()[-3000:]}"
                )
            try:
                if check():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"predictor not {what} after {timeout}s:\n{self.logs()[-3000:]}")

    def metric(self, name: str, **labels: str) -> float:
        """Value of one sample from /metrics (0 when absent)."""
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def stop(self, grace_s: float = 30.0) -> int:
        # Longer than bench's default: the drain on SIGTERM may take DRAIN_TIMEOUT_S.
        return super().stop(grace_s)


@pytest.fixture(scope="session")
def start_predictor(s3_server, published_voice, tmp_path_factory):
    """Factory: start a predictor from the published voice; env overrides per call. Stopped at the end."""
    started: list[PredictorProcess] = []

    def start(wait: bool = True, **env: str) -> PredictorProcess:
        base = {
            **aws_env_for(s3_server),
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "STORAGE_URI": published_voice,
            "MODEL_DIR": str(tmp_path_factory.mktemp("model")),
            "MAX_TEXT_CHARS": "2000",
            # The suites were written for the engine that seeds and batches; ENGINE=auto (onnx on
            # CPU) is tested where a test asks for it (ENGINE="auto").
            "ENGINE": "torch",
        }
        log_path = tmp_path_factory.mktemp("logs") / "predictor.log"
        p = PredictorProcess({**base, **env}, log_path)
        started.append(p)
        if wait:
            p.wait_ready()
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture(scope="session")
def predictor(start_predictor) -> PredictorProcess:
    """One warm predictor shared by the protocol tests."""
    return start_predictor()


def v2_request(*texts: str, **parameters) -> dict:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}]}
    if parameters:
        body["parameters"] = parameters
    return body


# --- Prometheus (the Debian package) as a real process ------------------------------------------


class PrometheusProcess(Child):
    """Debian's prometheus on a free port, scraping `targets` and evaluating `rule_files` every second."""

    def __init__(self, workdir: Path, targets: list[tuple[str, dict[str, str]]], rule_files: list[Path]):
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError(
                "prometheus is not installed: run `make system-packages` (apt-get install prometheus)"
            )
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            # One second, not the production 10 s, so a test sees rates within seconds.
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            # The job name a PodMonitor tts/tts-predictor gives its targets.
            "scrape_configs": [
                {
                    "job_name": "tts/tts-predictor",
                    "static_configs": [{"targets": [t], "labels": labels} for t, labels in targets],
                }
            ],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        super().__init__("prometheus", argv, dict(os.environ), workdir / "prometheus.log")
        wait_until(
            lambda: httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200,
            60,
            "prometheus ready",
            self,
        )

    def query(self, expr: str) -> list[dict]:
        """Instant query through the HTTP API; the result vector (raises on a query error)."""
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        if body["status"] != "success":
            raise AssertionError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def rules(self) -> list[dict]:
        groups = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]


@pytest.fixture
def prometheus(tmp_path: Path):
    """Factory: start a Prometheus scraping the given (host:port, labels) targets; stopped after the test."""
    started: list[PrometheusProcess] = []

    def start(targets: list[tuple[str, dict[str, str]]], rule_files: list[Path]) -> PrometheusProcess:
        workdir = tmp_path / f"prometheus-{len(started)}"
        workdir.mkdir()
        started.append(PrometheusProcess(workdir, targets, rule_files))
        return started[-1]

    yield start
    for p in started:
        p.stop()
