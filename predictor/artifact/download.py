"""Ranged, parallel, resumable downloads from S3 or a local directory, verified as they land."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from predictor.artifact.manifest import MANIFEST, ManifestFile, safe_join
from predictor.artifact.verified import Markers
from predictor.errors import (
    ArtifactNotFound,
    IntegrityError,
    StorageError,
    TransientStorageError,
)
from predictor.storage.files import atomic_write_bytes, fsync_dir, preallocate, pwrite_all
from predictor.storage.s3 import failure, s3_client
from predictor.storage.uri import object_key, parse_uri

log = logging.getLogger("predictor.storage")


MiB = 1024 * 1024


# Unit of streaming: bounds memory per in-flight part and sets the progress granularity.
_CHUNK = 1024 * 1024


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


T = TypeVar("T")


ByteCallback = Callable[[int], None]


class _Retryable(Exception):
    """A failure another attempt can fix: connection dropped, short body, 5xx, throttling."""


class _Cancelled(Exception):
    """Another part failed; this one stops without adding noise."""


@dataclass(frozen=True)
class RetryPolicy:
    """The one retry policy of a fetch: ``retries`` retries after the first attempt, the n-th after
    ``backoff_s`` x 2^(n-1), +-50 % jitter. Each ranged GET retries under it (FETCH_RETRIES,
    FETCH_BACKOFF_S); cold start's whole-artifact attempts too (serving/coldstart.artifact_policy)."""

    retries: int
    backoff_s: float

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure."""
        # Jitter: parts that failed together (a dropped pool, a throttled prefix) must not retry in step.
        return self.backoff_s * 2 ** (failures - 1) * random.uniform(0.5, 1.5)

    def pause(self, exc: _Retryable, failures: int, stop: threading.Event | None = None) -> None:
        """Wait before the next attempt, or give up once ``retries`` retries are spent."""
        if failures > self.retries:
            raise TransientStorageError(f"{exc} (gave up after {failures} attempts)") from exc
        delay = self.delay(failures)
        log.warning("retry %d/%d in %.2fs after: %s", failures, self.retries, delay, exc)
        if stop is None:
            time.sleep(delay)
        elif stop.wait(delay):
            raise _Cancelled()

    def run(self, op: Callable[[], T]) -> T:
        failures = 0
        while True:
            try:
                return op()
            except _Retryable as exc:
                failures += 1
                self.pause(exc, failures)


class _Source(Protocol):
    def describe(self, rel: str) -> str: ...

    def read_manifest(self) -> bytes: ...

    def read_range(self, rel: str, start: int, end: int, size: int) -> Iterator[bytes]:
        """Bytes ``start..end`` (inclusive) of ``rel``, whose manifest size is ``size``."""
        ...


def open_source(
    uri: str, concurrency: int, endpoint_url: str | None, read_timeout_s: float = 60.0
) -> _Source:
    scheme, where, prefix = parse_uri(uri)
    if scheme == "s3":
        client = s3_client(concurrency=concurrency, endpoint_url=endpoint_url, read_timeout_s=read_timeout_s)
        return _S3Source(client, where, prefix)
    return _LocalSource(Path(where))


class _S3Source:
    def __init__(self, client: Any, bucket: str, prefix: str):
        self._client = client
        self._bucket = bucket
        self._prefix = prefix

    def describe(self, rel: str) -> str:
        return f"s3://{self._bucket}/{object_key(self._prefix, rel)}"

    def read_manifest(self) -> bytes:
        with self._translated(MANIFEST):
            body = self._client.get_object(Bucket=self._bucket, Key=object_key(self._prefix, MANIFEST))[
                "Body"
            ]
            return body.read()  # botocore checks the length against Content-Length

    def read_range(self, rel: str, start: int, end: int, size: int) -> Iterator[bytes]:
        with self._translated(rel):
            resp = self._client.get_object(
                Bucket=self._bucket, Key=object_key(self._prefix, rel), Range=f"bytes={start}-{end}"
            )
            body = resp["Body"]
            try:
                self._check_range(rel, resp, start, end, size)
                yield from body.iter_chunks(_CHUNK)
            finally:
                body.close()  # an abandoned stream must not go back to the pool half-read

    def _check_range(self, rel: str, resp: dict, start: int, end: int, size: int) -> None:
        where = self.describe(rel)
        match = _CONTENT_RANGE.fullmatch(resp.get("ContentRange") or "")
        if match is None:
            # A server that ignores Range answers 200 with the whole object; fine only if that was asked.
            if start == 0 and end + 1 == size == resp.get("ContentLength"):
                return
            raise StorageError(f"{where}: the server ignored the Range header")
        first, _, total = match.groups()
        if total != "*" and int(total) != size:
            raise IntegrityError(f"{where}: object is {total} bytes, manifest says {size}")
        if int(first) != start:
            raise StorageError(f"{where}: asked for bytes from {start}, got from {first}")

    @contextmanager
    def _translated(self, rel: str) -> Iterator[None]:
        """Turn botocore's errors into ours, deciding here which ones are worth a retry."""
        from botocore.exceptions import (
            ClientError,
            HTTPClientError,
            IncompleteReadError,
        )
        from botocore.exceptions import (
            ConnectionError as BotoConnectionError,
        )

        where = self.describe(rel)
        try:
            yield
        except ClientError as exc:
            raise _classify(exc, where) from exc
        # Endpoint unreachable, connect/read timeouts, connection closed mid-response, short body.
        except (BotoConnectionError, HTTPClientError, IncompleteReadError, ConnectionError) as exc:
            raise _Retryable(f"{where}: {exc}") from exc


def _classify(exc: Any, where: str) -> Exception:
    f = failure(exc)
    if f.not_found:
        return ArtifactNotFound(f"{where} not found ({f.detail})")
    if f.denied:
        return StorageError(f"{where}: access denied ({f.detail}); check the credentials and bucket policy")
    if f.bad_range:
        return IntegrityError(f"{where}: object is shorter than the manifest says ({f.detail})")
    if f.transient:
        return _Retryable(f"{where}: {f.detail}")
    return StorageError(f"{where}: {f.detail}")


class _LocalSource:
    def __init__(self, root: Path):
        self._root = root

    def describe(self, rel: str) -> str:
        return str(self._root / rel)

    def read_manifest(self) -> bytes:
        path = self._root / MANIFEST
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise ArtifactNotFound(f"{path} not found") from None
        except OSError as exc:
            raise StorageError(f"{path}: {exc}") from exc

    def read_range(self, rel: str, start: int, end: int, size: int) -> Iterator[bytes]:
        path = safe_join(self._root, rel)  # the source tree must not lead us outside it either
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise ArtifactNotFound(f"{path} not found") from None
        except OSError as exc:
            raise StorageError(f"{path}: {exc}") from exc
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise IntegrityError(f"{path}: file is {actual} bytes, manifest says {size}")
            pos = start
            while pos <= end:
                chunk = os.pread(fd, min(_CHUNK, end + 1 - pos), pos)
                if not chunk:
                    return  # shrank under us: the caller sees a short part
                yield chunk
                pos += len(chunk)
        finally:
            os.close(fd)


class Meter:
    """Counts bytes written and forwards them to the callbacks, one call at a time."""

    def __init__(self, callbacks: list[ByteCallback]):
        self._callbacks = callbacks
        self._lock = threading.Lock()
        self.total = 0

    def __call__(self, n: int) -> None:
        with self._lock:
            self.total += n
            for callback in self._callbacks:
                callback(n)


@dataclass(eq=False)
class _Job:
    """One file being downloaded: its temp file, how many parts are outstanding, and its running hash.

    Parts finish out of order; whichever thread completes the next part in order hashes it (read back
    from the page cache), so the sha256 is nearly done when the last byte lands instead of costing a
    full second pass over the file at the end.
    """

    file: ManifestFile
    target: Path
    tmp: Path
    fd: int
    remaining: int
    part_size: int
    done: set[int] = field(default_factory=set)  # starts of the parts already on disk (the journal)
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)
    hashed_to: int = 0  # bytes [0, hashed_to) are in the hash
    completed: dict[int, int] = field(default_factory=dict)  # start -> end of parts not yet hashed
    hash_lock: threading.Lock = field(default_factory=threading.Lock)

    def part_done(self, start: int, end: int) -> None:
        # Durable before journaled: a part the journal names must be on disk after a crash.
        os.fdatasync(self.fd)
        with self.lock:
            self.completed[start] = end
            self.done.add(start)
            atomic_write_bytes(journal_path(self.target), self._journal())
        self.advance_hash(block=False)

    def _journal(self) -> bytes:
        entry = {"sha256": self.file.sha256, "size": self.file.size, "part_size": self.part_size}
        return json.dumps({**entry, "done": sorted(self.done)}).encode()

    def resumable(self, path: Path) -> set[int]:
        """Parts a journal at ``path`` says are done, if it describes this very file and layout."""
        try:
            saved = json.loads(path.read_text())
            done = {int(start) for start in saved["done"]}
        except (OSError, ValueError, KeyError, TypeError):
            return set()
        same = (saved.get("sha256"), saved.get("size"), saved.get("part_size")) == (
            self.file.sha256,
            self.file.size,
            self.part_size,
        )
        return done if same else set()

    def advance_hash(self, block: bool) -> None:
        """Hash every completed part that continues the hashed prefix; one thread hashes at a time."""
        while self.hash_lock.acquire(blocking=block):
            try:
                while True:
                    with self.lock:
                        end = self.completed.pop(self.hashed_to, None)
                    if end is None:
                        break
                    self._hash_range(self.hashed_to, end)
                    self.hashed_to = end + 1
            finally:
                self.hash_lock.release()
            with self.lock:
                if self.hashed_to not in self.completed:
                    return  # nothing arrived while we held the lock

    def _hash_range(self, start: int, end: int) -> None:
        pos = start
        while pos <= end:
            chunk = os.pread(self.fd, min(_HASH_CHUNK, end + 1 - pos), pos)
            if not chunk:
                raise IntegrityError(f"{self.file.path}: temp file shorter than written ({pos} bytes)")
            self.hasher.update(chunk)
            pos += len(chunk)

    def close(self) -> None:
        with self.lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1

    def discard(self) -> None:
        """Forget the partial file and its journal: the next attempt starts this file over."""
        self.close()
        self.tmp.unlink(missing_ok=True)
        journal_path(self.target).unlink(missing_ok=True)


def partial_path(target: Path) -> Path:
    """Where ``target`` is assembled: hidden (names starting with "." are reserved), one per target, so
    a later attempt or a restarted container finds it and resumes."""
    return target.with_name(f".{target.name}.partial")


def journal_path(target: Path) -> Path:
    """The parts of ``partial_path(target)`` already written and flushed, as JSON."""
    return target.with_name(f".{target.name}.partial.json")


_HASH_CHUNK = 1 << 20  # bytes read back per hash update: big enough that hashlib releases the GIL


def _resumable_failure(error: BaseException | None) -> bool:
    """Whether the parts already written are worth keeping for the next attempt.

    Network failures (retries spent, another part cancelled, the process interrupted) keep them; a
    checksum mismatch, a full disk or an unexpected error starts the file over.
    """
    return isinstance(error, TransientStorageError | _Cancelled | KeyboardInterrupt)


def _ranges(size: int, part_size: int) -> list[tuple[int, int]]:
    return [(start, min(start + part_size, size) - 1) for start in range(0, size, part_size)]


class Downloader:
    def __init__(
        self,
        source: _Source,
        markers: Markers,
        concurrency: int,
        part_size: int,
        policy: RetryPolicy,
        meter: Meter,
    ):
        self._source = source
        self._markers = markers
        self._concurrency = concurrency
        self._part_size = part_size
        self._policy = policy
        self._meter = meter
        self._stop = threading.Event()

    def run(self, todo: list[tuple[ManifestFile, Path]]) -> None:
        """Download every file; on any failure stop the rest and leave no temp file behind."""
        jobs: list[_Job] = []
        pool = ThreadPoolExecutor(max_workers=self._concurrency, thread_name_prefix="fetch")
        ok = False
        try:
            futures: list[Future] = []
            for f, target in todo:
                ranges = _ranges(f.size, self._part_size)
                job = self._open(f, target, ranges)
                jobs.append(job)
                todo_ranges = [(start, end) for start, end in ranges if start not in job.done]
                if not todo_ranges:
                    futures.append(pool.submit(self._finish, job))
                futures.extend(pool.submit(self._part, job, start, end) for start, end in todo_ranges)
            wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:  # in submission order, so the error reported is deterministic
                error = future.exception() if future.done() and not future.cancelled() else None
                if error is not None:
                    raise error
            ok = True
        finally:
            if not ok:
                self._stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            if not ok:
                error = sys.exc_info()[1]
                for job in jobs:
                    if _resumable_failure(error):
                        job.close()  # written parts stay, journaled, for the next attempt
                    else:
                        job.discard()  # a no-op for files already renamed into place

    def _open(self, f: ManifestFile, target: Path, ranges: list[tuple[int, int]]) -> _Job:
        """The job for ``target``, resuming a partial file a failed attempt or a killed container left.

        Resumed bytes are not trusted: the whole file is hashed before it is renamed into place, and a
        mismatch discards the partial file (IntegrityError), so the next attempt starts it over.
        """
        target.parent.mkdir(parents=True, exist_ok=True)
        # Temp files of older versions' fetches would otherwise fill the emptyDir.
        for stale in target.parent.glob(f".{glob.escape(target.name)}.part-*"):
            stale.unlink(missing_ok=True)
        tmp = partial_path(target)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o644)
        job = _Job(file=f, target=target, tmp=tmp, fd=fd, remaining=len(ranges), part_size=self._part_size)
        try:
            done = job.resumable(journal_path(target)) & {start for start, _ in ranges}
            if done and os.fstat(fd).st_size == f.size:
                job.done = done
                job.remaining -= len(done)
                job.completed = {start: end for start, end in ranges if start in done}
                log.info("resuming %s: %d of %d parts already on disk", f.path, len(done), len(ranges))
            else:
                os.ftruncate(fd, 0)
                journal_path(target).unlink(missing_ok=True)
            preallocate(fd, f.size)
        except BaseException:
            job.discard()
            raise
        return job

    def _part(self, job: _Job, start: int, end: int) -> None:
        """Write bytes start..end of the job's file, resuming after a dropped stream where it stopped."""
        pos = start
        failures = 0
        while pos <= end:
            try:
                for chunk in self._source.read_range(job.file.path, pos, end, job.file.size):
                    if self._stop.is_set():
                        raise _Cancelled()
                    if pos + len(chunk) > end + 1:
                        raise StorageError(
                            f"{self._source.describe(job.file.path)}: got more bytes than range {start}-{end}"
                        )
                    pwrite_all(job.fd, chunk, pos)
                    pos += len(chunk)
                    self._meter(len(chunk))
                if pos <= end:
                    raise _Retryable(
                        f"{self._source.describe(job.file.path)}: short read, "
                        f"{pos - start} of {end + 1 - start} bytes"
                    )
            except _Retryable as exc:
                failures += 1
                self._policy.pause(exc, failures, self._stop)
        job.part_done(start, end)
        with job.lock:
            job.remaining -= 1
            last = job.remaining == 0
        if last:
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        """Verify the complete temp file, then make it the target atomically and durably."""
        f = job.file
        try:
            size = os.fstat(job.fd).st_size
            if size != f.size:
                raise IntegrityError(f"{f.path}: size {size} does not match manifest {f.size}")
            job.advance_hash(block=True)
            if job.hashed_to != f.size:  # parts cover the file exactly; anything else is our bug
                raise IntegrityError(f"{f.path}: hashed {job.hashed_to} of {f.size} bytes")
            digest = job.hasher.hexdigest()
            if digest != f.sha256:
                raise IntegrityError(
                    f"{f.path}: sha256 {digest} does not match manifest {f.sha256} "
                    f"(from {self._source.describe(f.path)})"
                )
            os.fsync(job.fd)
            job.close()
            os.replace(job.tmp, job.target)
        except IntegrityError:
            job.discard()
            raise
        except BaseException:
            job.close()
            raise
        journal_path(job.target).unlink(missing_ok=True)
        fsync_dir(job.target.parent)
        self._markers.write(f, job.target)
        log.info("downloaded %s (%d bytes) in %.2fs", f.path, f.size, time.monotonic() - job.started)
