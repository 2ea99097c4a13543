"""Cold start as a pipeline begun before the server's imports.

    process "fetch":   fetch and verify the artifact (boto3, the network, sha256)
    thread "engine":   construct the engine (onnxruntime import, device checks, espeak data)
    thread "pipeline": wait for both -> load -> warm-up

The server (imported meanwhile on the main thread) only waits for the result and flips readiness.
The fetch runs in a forked process because its Python work (boto3's import and client setup,
thousands of chunk writes) would otherwise queue for the GIL behind the server's imports; a process
of its own runs on another core. The fork happens first, while this process has no other threads.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, TypeVar

from predictor.config import ConfigError, Settings

# Everything heavier (boto3, numpy, the engine's packages) is imported on the cold-start threads, so
# they start before the main thread pays for a single one of those imports.
if TYPE_CHECKING:
    from predictor.artifact.download import RetryPolicy
    from predictor.artifact.fetch import FetchReport
    from predictor.artifact.manifest import Manifest
    from predictor.engine.base import Engine
    from predictor.errors import StorageError

T = TypeVar("T")
log = logging.getLogger("predictor.coldstart")

# Whole-artifact retries on top of the per-part ones inside fetching.fetch: a file that failed its
# checksum is fetched again from scratch (twice) before we give up and stay not ready. Under the
# parts' RetryPolicy, from 4 x FETCH_BACKOFF_S: what failed is an object, not one connection, and the
# first wait gives a publisher time to put a good object back.
ARTIFACT_RETRIES = 2
ARTIFACT_BACKOFF_FACTOR = 4
# Set on drain: a cold start still retrying its fetch gives up, so the process can exit.
_ABANDONED = threading.Event()


@dataclass
class ColdStart:
    engine: Engine
    manifest: Manifest
    report: FetchReport
    phases_ns: dict[str, tuple[int, int]] = field(default_factory=dict)  # phase -> (start, end), epoch ns


def begin(settings: Settings) -> Future:
    """Start cold start now; the future yields a ColdStart or raises (ConfigError means: exit)."""
    fetching = _FetchProcess(settings)  # before any thread exists: forking is safe
    pool = ThreadPoolExecutor(2, thread_name_prefix="cold-start")
    engine = pool.submit(_construct, settings)
    result = pool.submit(_pipeline, settings, engine, fetching)
    pool.shutdown(wait=False)
    return result


class _FetchProcess:
    """fetch(settings) in a forked child; result() returns its (manifest, report) or raises its error."""

    def __init__(self, settings: Settings):
        context = multiprocessing.get_context("fork")
        self._conn, child_end = context.Pipe(duplex=False)
        self.started_ns = time.time_ns()
        # daemon: if the predictor exits mid-download (SIGTERM), the download goes with it.
        self._process = context.Process(
            target=_fetch_child, args=(settings, child_end), name="fetch", daemon=True
        )
        self._process.start()
        child_end.close()

    def result(self) -> tuple[Manifest, FetchReport]:
        from predictor.errors import StorageError

        try:
            status, value = self._conn.recv()
        except EOFError:
            self._process.join()
            raise StorageError(f"the fetch process died (exit code {self._process.exitcode})") from None
        finally:
            self._conn.close()
        self._process.join()
        if status == "error":
            raise value
        return value


def _fetch_child(settings: Settings, conn: Connection) -> None:
    from predictor.errors import PredictorError, StorageError

    try:
        conn.send(("ok", fetch(settings)))
    except PredictorError as exc:
        conn.send(("error", exc))
    except BaseException as exc:  # anything else may not pickle: keep its text
        conn.send(("error", StorageError(f"fetch failed: {type(exc).__name__}: {exc}")))
    finally:
        conn.close()


def _construct(settings: Settings) -> Engine:
    from predictor.engine import factory as engines
    from predictor.errors import EngineError

    try:
        # The solo worker's copy has every CPU thread; without one, this is the first worker.
        return engines.create(settings, settings.threads() if settings.solo_worker() else None)
    except EngineError as exc:
        raise ConfigError(f"ENGINE={settings.engine_name} DEVICE={settings.device}: {exc.message}") from exc


def _timed(phases: dict[str, tuple[int, int]], name: str, step: Callable[[], T]) -> T:
    start = time.time_ns()
    value = step()
    phases[name] = (start, time.time_ns())
    return value


def _pipeline(settings: Settings, engine: Future, fetching: _FetchProcess) -> ColdStart:
    from predictor.errors import StorageError
    from predictor.observability import metrics

    phases: dict[str, tuple[int, int]] = {}
    try:
        manifest, report = fetching.result()
    except StorageError as exc:
        manifest, report = _until_fetched(settings, exc)
    phases["fetch"] = (fetching.started_ns, time.time_ns())
    metrics.FETCH_BYTES.inc(report.bytes_downloaded)
    metrics.FETCH_FILES.labels("downloaded").inc(report.files_downloaded)
    metrics.FETCH_FILES.labels("skipped").inc(report.files_skipped)
    eng: Engine = engine.result()
    _timed(phases, "load", lambda: eng.load(settings.model_dir))
    _timed(phases, "warmup", lambda: eng.warmup(settings.warmup_text))
    # The workers' copies (Settings.solo_worker) are made after ready, by copy(): predictor/server.py.
    return ColdStart(engine=eng, manifest=manifest, report=report, phases_ns=phases)


def copy(settings: Settings, threads: int | None = None) -> Engine:
    """A copy of the engine, loaded and warmed from the files the first one verified: a worker's, or
    with ``threads`` intra-op threads."""
    from predictor.engine.factory import create

    copy = create(settings, threads)
    copy.load(settings.model_dir)
    copy.warmup(settings.warmup_text)
    return copy


def abandon() -> None:
    """Stop trying to fetch (the process is draining): the recovery loop ends at its next wait."""
    _ABANDONED.set()


def _until_fetched(settings: Settings, error: StorageError) -> tuple[Manifest, FetchReport]:
    """Fetch again every FETCH_RECOVERY_S until it succeeds; the model is not ready meanwhile.

    Storage that is down, a bucket not yet published or a full emptyDir can all come right without
    this container restarting, and a restart would pay the imports again and still find the same
    storage. What was downloaded stays on disk and is resumed. Each failure is logged with its reason
    and counted in tts_cold_start_failures_total{reason}; the startup probe's failureThreshold remains
    the backstop that restarts a pod that never recovers.
    """
    from predictor.errors import StorageError
    from predictor.observability import metrics

    while True:
        metrics.COLD_START_FAILURES.labels(error.reason).inc()
        log.error(
            "fetching the artifact failed; the model stays not ready, next try in %g s: %s",
            settings.fetch_recovery_s,
            error.message,
            extra={"reason": error.reason},
        )
        if _ABANDONED.wait(settings.fetch_recovery_s):
            raise error
        try:
            manifest, report = fetch(settings)
        except StorageError as exc:
            error = exc
            continue
        log.info("the artifact fetch recovered; loading")
        return manifest, report


def artifact_policy(settings: Settings) -> RetryPolicy:
    """The whole-artifact attempts' retries: the fetch's one RetryPolicy, from a longer first wait."""
    from predictor.artifact.download import RetryPolicy

    return RetryPolicy(ARTIFACT_RETRIES, settings.fetch_backoff_s * ARTIFACT_BACKOFF_FACTOR)


def fetch(settings: Settings) -> tuple[Manifest, FetchReport]:
    from predictor.artifact import fetch as fetching
    from predictor.errors import IntegrityError, TransientStorageError

    # Empty VOICE_URI: the artifact is already in MODEL_DIR; it is still verified, never trusted.
    uri = settings.voice_uri or str(settings.model_dir)
    policy = artifact_policy(settings)
    attempts = policy.retries + 1
    for attempt in range(1, attempts + 1):
        try:
            manifest, report = fetching.fetch(
                uri,
                settings.model_dir,
                **fetching.FetchOptions.from_settings(settings).as_kwargs(),
                engine=settings.engine_name,
            )
            return manifest, report
        except (TransientStorageError, IntegrityError) as exc:
            if attempt == attempts:
                raise
            log.warning("fetch attempt %d/%d failed, retrying: %s", attempt, attempts, exc)
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


def process_age_s() -> float:
    """Seconds since this process was exec'd (from /proc), so cold start includes interpreter start."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
