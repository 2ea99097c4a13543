"""Fetch an artifact into MODEL_DIR: what a pod does at cold start.

The manifest is read first and every path in it checked before anything is written. Files already in
MODEL_DIR with the right size and sha256 are kept, so a restarted container downloads nothing. The rest
is fetched as ranged GETs of all files through one thread pool, written with ``pwrite`` into a hidden
temp file next to the target, verified, and renamed into place: the final path never holds a partial or
corrupt file. ``manifest.json`` is written into MODEL_DIR last, so its presence means "complete".

Endpoint and credentials come from the standard AWS_* environment variables, which boto3 reads itself;
nothing here reads or logs them."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictor.artifact.download import ByteCallback, Downloader, Meter, MiB, RetryPolicy, open_source
from predictor.artifact.manifest import MANIFEST, Manifest, resolve_files
from predictor.artifact.verified import SOURCE, VERIFIED_DIR, Markers, is_current, verified_earlier
from predictor.errors import ModelDirError
from predictor.storage.files import atomic_write_bytes

if TYPE_CHECKING:
    from predictor.config import Settings

log = logging.getLogger("predictor.storage")


@dataclass
class FetchReport:
    files_total: int
    files_downloaded: int
    files_skipped: int
    bytes_downloaded: int
    seconds: float


@dataclass(frozen=True)
class FetchOptions:
    """The fetch knobs from Settings, built in one place for every caller (cold start, CLI fetch/synth)."""

    concurrency: int
    part_size: int
    retries: int
    backoff_s: float
    read_timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> FetchOptions:
        return cls(
            concurrency=settings.fetch_concurrency,
            part_size=settings.fetch_part_size,
            retries=settings.fetch_retries,
            backoff_s=settings.fetch_backoff_s,
            read_timeout_s=settings.s3_read_timeout_s,
        )

    def as_kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fetch(
    uri: str,
    model_dir: Path,
    *,
    concurrency: int = 8,
    part_size: int = 8 * MiB,
    retries: int = 5,
    backoff_s: float = 0.2,
    progress: ByteCallback | None = None,
    on_bytes: ByteCallback | None = None,
    endpoint_url: str | None = None,
    engine: str | None = None,
    read_timeout_s: float = 60.0,
) -> tuple[Manifest, FetchReport]:
    """Make ``model_dir`` hold the verified artifact at ``uri``; returns its manifest and what was done.

    ``progress`` and ``on_bytes`` are both called with the number of bytes just written, as they
    arrive (e.g. a tqdm bar and a metrics counter). Calls are serialized, so neither needs a lock.
    ``endpoint_url`` overrides AWS_ENDPOINT_URL. Retryable failures (connections, short bodies, 5xx,
    throttling) are retried ``retries`` times per part with exponential backoff starting at
    ``backoff_s``, then raise TransientStorageError. With ``engine``, only the files that engine
    reads are fetched (the manifest's per-file ``engines``).
    """
    if concurrency < 1 or part_size < 1 or retries < 0 or backoff_s < 0:
        raise ValueError("concurrency and part_size must be >= 1, retries and backoff_s >= 0")
    started = time.monotonic()
    model_dir = Path(model_dir)
    restarted = verified_earlier(uri, model_dir, engine)
    if restarted is not None:
        wanted = len(restarted.files_for(engine))
        report = FetchReport(wanted, 0, wanted, 0, time.monotonic() - started)
        log.info(
            "%s %s from %s is already in %s and verified; nothing to fetch",
            restarted.name,
            restarted.version,
            uri,
            model_dir,
        )
        return restarted, report
    source = open_source(uri, concurrency, endpoint_url, read_timeout_s)
    policy = RetryPolicy(retries, backoff_s)
    meter = Meter([cb for cb in (progress, on_bytes) if cb is not None])

    where = source.describe(MANIFEST)
    manifest = Manifest.loads(policy.run(source.read_manifest), source=where)
    # Every path is checked before anything is written: a hostile manifest leaves no trace.
    targets = [(f, t) for f, t in resolve_files(manifest, model_dir) if f in manifest.files_for(engine)]

    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        markers = Markers(model_dir)
        todo = []
        for f, target in targets:
            if is_current(f, target, markers):
                log.info("skipped %s: already verified (%d bytes)", f.path, f.size)
            else:
                todo.append((f, target))
        if todo:
            # Until every file is in place, a manifest here would claim an artifact that is not.
            (model_dir / MANIFEST).unlink(missing_ok=True)
            Downloader(source, markers, concurrency, part_size, policy, meter).run(todo)
        atomic_write_bytes(model_dir / MANIFEST, manifest.dumps().encode())
        atomic_write_bytes(model_dir / VERIFIED_DIR / SOURCE, json.dumps({"uri": uri}).encode())
    except OSError as exc:
        # Network errors were translated by the source, so an OSError here is the local disk.
        raise ModelDirError(_disk_message(model_dir, targets, exc)) from exc

    report = FetchReport(
        files_total=len(targets),
        files_downloaded=len(todo),
        files_skipped=len(targets) - len(todo),
        bytes_downloaded=meter.total,
        seconds=time.monotonic() - started,
    )
    log.info(
        "fetched %s %s from %s: %d downloaded (%d bytes), %d skipped, %.2fs",
        manifest.name,
        manifest.version,
        uri,
        report.files_downloaded,
        report.bytes_downloaded,
        report.files_skipped,
        report.seconds,
    )
    return manifest, report


def _disk_message(model_dir: Path, targets: list[tuple[Any, Path]], exc: OSError) -> str:
    """What went wrong writing into MODEL_DIR, with the sizes that matter when it is full."""
    message = f"writing into MODEL_DIR {model_dir} failed: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        needed = sum(f.size for f, _ in targets)
        try:
            free = shutil.disk_usage(model_dir).free
        except OSError:
            return f"{message} (the artifact needs {needed} bytes)"
        message += f" (the artifact needs {needed} bytes, {free} free); give the emptyDir more room"
    return message
