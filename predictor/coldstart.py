"""Cold start as a pipeline on background threads, begun before the server's imports.

    thread "engine": construct the engine (onnxruntime import, device checks, espeak data)
    thread "fetch":  fetch the artifact -> wait for the engine -> load -> warm-up

The server (imported meanwhile on the main thread) only waits for the result and flips readiness,
so the download, the heavy imports and the engine setup all overlap.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from predictor.config import ConfigError, Settings

# Everything heavier (boto3, numpy, the engine's packages) is imported on the cold-start threads, so
# they start before the main thread pays for a single one of those imports.
if TYPE_CHECKING:
    from predictor.artifact import Manifest
    from predictor.engine import Engine
    from predictor.storage import FetchReport

log = logging.getLogger("predictor.coldstart")

# Whole-artifact attempts on top of the per-part retries inside storage.fetch: a file that failed
# its checksum is fetched again from scratch before we give up and stay not ready.
FETCH_ATTEMPTS = 3


@dataclass
class ColdStart:
    engine: Engine
    manifest: Manifest
    report: FetchReport
    phases_ns: dict[str, tuple[int, int]] = field(default_factory=dict)  # phase -> (start, end), epoch ns


def begin(settings: Settings) -> Future:
    """Start cold start now; the future yields a ColdStart or raises (ConfigError means: exit)."""
    pool = ThreadPoolExecutor(2, thread_name_prefix="cold-start")
    engine = pool.submit(_construct, settings)
    result = pool.submit(_pipeline, settings, engine)
    pool.shutdown(wait=False)
    return result


def _construct(settings: Settings) -> Engine:
    from predictor import engine
    from predictor.errors import EngineError

    try:
        return engine.create(settings)
    except EngineError as exc:
        raise ConfigError(f"ENGINE={settings.engine} DEVICE={settings.device}: {exc.message}") from exc


def _timed(phases: dict, name: str, step):
    start = time.time_ns()
    value = step()
    phases[name] = (start, time.time_ns())
    return value


def _pipeline(settings: Settings, engine: Future) -> ColdStart:
    phases: dict[str, tuple[int, int]] = {}
    manifest, report = _timed(phases, "fetch", lambda: fetch(settings))
    eng: Engine = engine.result()
    _timed(phases, "load", lambda: eng.load(settings.model_dir))
    _timed(phases, "warmup", lambda: eng.warmup(settings.warmup_text))
    return ColdStart(engine=eng, manifest=manifest, report=report, phases_ns=phases)


def fetch(settings: Settings) -> tuple[Manifest, FetchReport]:
    from predictor import metrics, storage
    from predictor.errors import IntegrityError, TransientStorageError

    # Empty STORAGE_URI: the artifact is already in MODEL_DIR; it is still verified, never trusted.
    uri = settings.storage_uri or str(settings.model_dir)
    for attempt in range(1, FETCH_ATTEMPTS + 1):
        try:
            manifest, report = storage.fetch(
                uri,
                settings.model_dir,
                concurrency=settings.fetch_concurrency,
                part_size=settings.fetch_part_size,
                retries=settings.fetch_retries,
                backoff_s=settings.fetch_backoff_s,
                on_bytes=metrics.FETCH_BYTES.inc,
            )
            metrics.FETCH_FILES.labels("downloaded").inc(report.files_downloaded)
            metrics.FETCH_FILES.labels("skipped").inc(report.files_skipped)
            return manifest, report
        except (TransientStorageError, IntegrityError) as exc:
            if attempt == FETCH_ATTEMPTS:
                raise
            log.warning("fetch attempt %d/%d failed, retrying: %s", attempt, FETCH_ATTEMPTS, exc)
            time.sleep(settings.fetch_backoff_s * 4**attempt)
    raise AssertionError("unreachable")
