"""Shared fixtures: a real S3 (moto_server on a local port) and the default voice published to it.

At the end of the session every log the suite wrote is scanned (see ``_scan_logs``): the test
credentials must appear in none, and every line a predictor wrote in JSON mode must parse as JSON.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testing.audio import ReferenceVoice
from testing.predictor import PredictorProcess, not_json_lines
from testing.prometheus import PrometheusProcess
from testing.s3 import (
    AWS_OVERRIDES,
    QUIET_VOICE_URI,
    SECRET,
    VOICE_URI,
    MotoServer,
    aws_env,
    build_quiet_voice,
    build_voice,
    publish_voice,
)

# tests/e2e needs the cluster of `make cluster` (an hour's cold build): `make e2e` collects it (E2E=1),
# `make test` never does.
collect_ignore = [] if os.environ.get("E2E") else ["e2e"]

# Files the scan reads: what predictors, moto, Prometheus, Envoy and shadow sinks write. Model
# weights (tens of MB per predictor) are skipped: they are the published voice, not output.
SCANNED_SUFFIXES = (".log", ".jsonl", ".json", ".txt", ".yml", ".conf")
SCAN_MAX_BYTES = 50 * 2**20


@pytest.fixture(scope="session", autouse=True)
def _scan_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After every test, passed or failed: no file the suite wrote holds the test secret key."""
    yield
    root = tmp_path_factory.getbasetemp()
    leaks = [
        str(path.relative_to(root))
        for path in sorted(root.rglob("*"))
        if path.suffix in SCANNED_SUFFIXES
        and path.is_file()
        and path.stat().st_size <= SCAN_MAX_BYTES
        and SECRET.encode() in path.read_bytes()
    ]
    assert not leaks, f"the test secret key (testing/s3.py SECRET) was written to {leaks}"


def _apply_aws_env(mp: pytest.MonkeyPatch, endpoint: str) -> None:
    for name in AWS_OVERRIDES:
        mp.delenv(name, raising=False)
    for name, value in aws_env(endpoint).items():
        mp.setenv(name, value)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server in a subprocess on a free local port; yields its endpoint URL."""
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto_server.log", timeout=30)
    try:
        yield server.endpoint
    finally:
        server.stop(10)


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point boto3 (through the standard AWS_* variables) at the moto server; returns the endpoint."""
    _apply_aws_env(monkeypatch, s3_server)
    return s3_server


@pytest.fixture(scope="session")
def voice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default voice laid out as an artifact (files + manifest.json) in a session temp dir."""
    return build_voice(tmp_path_factory.mktemp("voice"))


@pytest.fixture(scope="session")
def published_voice(s3_server: str, voice_dir: Path) -> str:
    """The default voice published to the moto server; returns its s3:// URI."""
    with pytest.MonkeyPatch.context() as mp:
        _apply_aws_env(mp, s3_server)
        return publish_voice(voice_dir, VOICE_URI, s3_server)


class _Predictors:
    """Every predictor the session started, in order, and the session fixtures' ones that outlive the
    test or module that first asked for them."""

    def __init__(self) -> None:
        self.started: list[PredictorProcess] = []
        self.shared: set[int] = set()

    def stop_after(self, count: int) -> None:
        """Stop the ones started after the first ``count``, but for the shared ones."""
        for p in self.started[count:]:
            if id(p) not in self.shared:
                p.stop()


@pytest.fixture(scope="session")
def _predictors() -> _Predictors:
    return _Predictors()


# A predictor holds about 0.9 GB; kept to the session's end, the ones single tests and modules start
# add up past CI's 24 GiB before half the suite has run (the run was killed). Each is stopped when the
# test or module that started it ends.
@pytest.fixture(scope="module", autouse=True)
def _stop_the_modules_predictors(_predictors: _Predictors) -> Iterator[None]:
    count = len(_predictors.started)
    yield
    _predictors.stop_after(count)


@pytest.fixture(autouse=True)
def _stop_the_tests_predictors(_predictors: _Predictors) -> Iterator[None]:
    count = len(_predictors.started)
    yield
    _predictors.stop_after(count)


@pytest.fixture(scope="session")
def start_predictor(
    s3_server: str, published_voice: str, tmp_path_factory: pytest.TempPathFactory, _predictors: _Predictors
) -> Iterator[Callable[..., PredictorProcess]]:
    """Factory: start a predictor from the published voice; env overrides per call. Stopped when the
    test or module that started it ends (a session fixture's, at the session's end: ``_shared``).

    The secret key is SECRET, which must never show up in its logs or metrics."""
    started = _predictors.started

    def start(wait: bool = True, **env: str) -> PredictorProcess:
        base = {
            **aws_env(s3_server, secret_access_key=SECRET),
            "VOICE_URI": published_voice,
            "MODEL_DIR": str(tmp_path_factory.mktemp("model")),
            "MAX_TEXT_CHARS": "2000",
            "CPU_THREADS": "1",  # two predictors may share CI's two cores
            # Where test events may write: test_events' bucket and the one whose absence it tests,
            # test_faults' and test_drain's.
            "CE_OUTPUT_PREFIXES": (
                "s3://event-outputs/jobs,s3://no-such-bucket-for-events,s3://fault-outputs,s3://drain-outputs"
            ),
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
    # Every predictor of the session, the ones that failed their cold start included.
    bad = {
        str(p.log_path): lines[:3]
        for p in started
        if p.env.get("LOG_FORMAT", "json") == "json" and (lines := not_json_lines(p.logs()))
    }
    assert not bad, f"predictors in JSON mode wrote lines that are not JSON: {bad}"


def _shared(predictors: _Predictors, p: PredictorProcess) -> PredictorProcess:
    """A session fixture's predictor: kept to the session's end, whichever test first asked for it."""
    predictors.shared.add(id(p))
    return p


@pytest.fixture(scope="session")
def predictor(start_predictor: Callable[..., PredictorProcess], _predictors: _Predictors) -> PredictorProcess:
    """One warm predictor shared by the protocol tests."""
    return _shared(_predictors, start_predictor())


@pytest.fixture(scope="session")
def plain_predictor(
    start_predictor: Callable[..., PredictorProcess],
    tmp_path_factory: pytest.TempPathFactory,
    _predictors: _Predictors,
) -> PredictorProcess:
    """A warm predictor with the settings no other one in the suite sets: LOG_FORMAT=text, SHADOW_SINK=
    a directory (``.shadow_dir``), MAX_BATCH_ITEMS=2. One process for the three spares CI's two cores a
    cold start per setting; each setting's test checks only its own behaviour."""
    shadow_dir = tmp_path_factory.mktemp("shadow-dir")
    p = start_predictor(
        LOG_FORMAT="text",
        SHADOW_SINK=str(shadow_dir),
        SHADOW_FLUSH_S="0.2",
        MAX_BATCH_ITEMS="2",
        REVISION="rev-dir",
    )
    p.shadow_dir = shadow_dir  # type: ignore[attr-defined]
    return _shared(_predictors, p)


@pytest.fixture(scope="session")
def reference(voice_dir: Path) -> ReferenceVoice:
    """The packaged voice on an in-process engine: what served audio is compared with (testing/audio.py)."""
    return ReferenceVoice(voice_dir)


@pytest.fixture(scope="session")
def quiet_predictor(
    start_predictor: Callable[..., PredictorProcess],
    s3_server: str,
    voice_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    _predictors: _Predictors,
) -> PredictorProcess:
    """A warm predictor of the voice without inference noise, for routes that take no noise parameters."""
    quiet = build_quiet_voice(voice_dir, tmp_path_factory.mktemp("quiet-voice"))
    with pytest.MonkeyPatch.context() as mp:
        _apply_aws_env(mp, s3_server)
        uri = publish_voice(quiet, QUIET_VOICE_URI, s3_server)
    return _shared(_predictors, start_predictor(VOICE_URI=uri))


# --- Prometheus (the Debian package) as a real process (testing/prometheus.py) ----------------
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
