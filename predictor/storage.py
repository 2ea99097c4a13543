"""Fetch an artifact into MODEL_DIR: what a pod does at cold start.

The manifest is read first and every path in it checked before anything is written. Files already in
MODEL_DIR with the right size and sha256 are kept, so a restarted container downloads nothing. The rest
is fetched as ranged GETs of all files through one thread pool, written with ``pwrite`` into a hidden
temp file next to the target, verified, and renamed into place: the final path never holds a partial or
corrupt file. ``manifest.json`` is written into MODEL_DIR last, so its presence means "complete".

Endpoint and credentials come from the standard AWS_* environment variables, which boto3 reads itself;
nothing here reads or logs them.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import logging
import os
import random
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import unquote, urlsplit

from predictor.artifact import (
    MANIFEST,
    Manifest,
    ManifestFile,
    atomic_write_bytes,
    fsync_dir,
    resolve_files,
    safe_join,
    sha256_file,
    temp_path_for,
)
from predictor.errors import ArtifactNotFound, IntegrityError, StorageError, TransientStorageError

log = logging.getLogger("predictor.storage")

MiB = 1024 * 1024
VERIFIED_DIR = ".verified"
SOURCE = "source.json"  # under VERIFIED_DIR: the URI the artifact in MODEL_DIR was fetched from
# Unit of streaming: bounds memory per in-flight part and sets the progress granularity.
_CHUNK = 1024 * 1024
_THROTTLED = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "RequestLimitExceeded",
}
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

T = TypeVar("T")
ByteCallback = Callable[[int], None]


@dataclass
class FetchReport:
    files_total: int
    files_downloaded: int
    files_skipped: int
    bytes_downloaded: int
    seconds: float


def parse_uri(uri: str) -> tuple[str, str, str]:
    """Split a storage URI into (scheme, bucket_or_root, prefix).

    ``s3://bucket/prefix`` -> ("s3", "bucket", "prefix"); ``file:///abs/path`` and plain paths ->
    ("file", "/abs/path", "").
    """
    expected = "expected s3://bucket/prefix, file:///absolute/path or a plain path"
    if not uri:
        raise StorageError(f"empty storage URI; {expected}")
    parts = urlsplit(uri)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise StorageError(f"storage URI {uri!r} names no bucket; {expected}")
        if parts.query or parts.fragment:
            raise StorageError(f"storage URI {uri!r} has a query or fragment; {expected}")
        return "s3", parts.netloc, parts.path.strip("/")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise StorageError(f"storage URI {uri!r} is not a local absolute path; {expected}")
        return "file", unquote(parts.path), ""
    if parts.scheme == "":
        return "file", os.path.abspath(uri), ""
    raise StorageError(f"unsupported storage URI scheme {parts.scheme!r} in {uri!r}; {expected}")


def object_key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def s3_client(*, concurrency: int, endpoint_url: str | None = None):
    """One S3 client for all threads (boto3 clients are thread-safe), with a connection per worker.

    botocore's own retries are off (one attempt in total): fetch retries per part and resumes where a
    dropped stream stopped, which botocore cannot do.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        max_pool_connections=concurrency + 2,
        retries={"total_max_attempts": 1},
        connect_timeout=10,
        read_timeout=60,
    )
    # A session of our own: the default one behind boto3.client() is shared process-wide state.
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


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
    restarted = _verified_earlier(uri, model_dir, engine)
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
    source = _open_source(uri, concurrency, endpoint_url)
    policy = _RetryPolicy(retries, backoff_s)
    meter = _Meter([cb for cb in (progress, on_bytes) if cb is not None])

    where = source.describe(MANIFEST)
    manifest = Manifest.loads(policy.run(source.read_manifest), source=where)
    # Every path is checked before anything is written: a hostile manifest leaves no trace.
    targets = [(f, t) for f, t in resolve_files(manifest, model_dir) if f in manifest.files_for(engine)]

    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        markers = _Markers(model_dir)
        todo = []
        for f, target in targets:
            if _is_current(f, target, markers):
                log.info("skipped %s: already verified (%d bytes)", f.path, f.size)
            else:
                todo.append((f, target))
        if todo:
            # Until every file is in place, a manifest here would claim an artifact that is not.
            (model_dir / MANIFEST).unlink(missing_ok=True)
            _Downloader(source, markers, concurrency, part_size, policy, meter).run(todo)
        atomic_write_bytes(model_dir / MANIFEST, manifest.dumps().encode())
        atomic_write_bytes(model_dir / VERIFIED_DIR / SOURCE, json.dumps({"uri": uri}).encode())
    except OSError as exc:
        # Network errors were translated by the source, so an OSError here is the local disk.
        raise StorageError(f"writing into {model_dir} failed: {exc}") from exc

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


# --- retries -------------------------------------------------------------------------------------


class _Retryable(Exception):
    """A failure another attempt can fix: connection dropped, short body, 5xx, throttling."""


class _Cancelled(Exception):
    """Another part failed; this one stops without adding noise."""


@dataclass(frozen=True)
class _RetryPolicy:
    retries: int
    backoff_s: float

    def pause(self, exc: _Retryable, failures: int, stop: threading.Event | None = None) -> None:
        """Wait before the next attempt, or give up once ``retries`` retries are spent."""
        if failures > self.retries:
            raise TransientStorageError(f"{exc} (gave up after {failures} attempts)") from exc
        # Jitter: parts that failed together (a dropped pool, a throttled prefix) must not retry in step.
        delay = self.backoff_s * 2 ** (failures - 1) * random.uniform(0.5, 1.5)
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


# --- sources -------------------------------------------------------------------------------------


class _Source(Protocol):
    def describe(self, rel: str) -> str: ...

    def read_manifest(self) -> bytes: ...

    def read_range(self, rel: str, start: int, end: int, size: int) -> Iterator[bytes]:
        """Bytes ``start..end`` (inclusive) of ``rel``, whose manifest size is ``size``."""
        ...


def _open_source(uri: str, concurrency: int, endpoint_url: str | None) -> _Source:
    scheme, where, prefix = parse_uri(uri)
    if scheme == "s3":
        return _S3Source(s3_client(concurrency=concurrency, endpoint_url=endpoint_url), where, prefix)
    return _LocalSource(Path(where))


class _S3Source:
    def __init__(self, client, bucket: str, prefix: str):
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


def _classify(exc, where: str) -> Exception:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    detail = f"{code or status} {error.get('Message', '')}".strip()
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound", "404"):
        return ArtifactNotFound(f"{where} not found ({detail})")
    if status == 403 or code in ("AccessDenied", "403"):
        return StorageError(f"{where}: access denied ({detail}); check the credentials and bucket policy")
    if status == 416 or code == "InvalidRange":
        return IntegrityError(f"{where}: object is shorter than the manifest says ({detail})")
    if status >= 500 or status == 429 or code in _THROTTLED:
        return _Retryable(f"{where}: {detail}")
    return StorageError(f"{where}: {detail}")


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


# --- verified markers ----------------------------------------------------------------------------


class _Markers:
    """``.verified/<path>.sha256``: proof a file was hashed, valid while its stat is unchanged.

    Re-hashing 60 MB on every container restart is what this avoids. ctime and inode are recorded next
    to size and mtime because a user can set mtime back (touch -d) but not ctime.
    """

    def __init__(self, model_dir: Path):
        self._root = model_dir.resolve() / VERIFIED_DIR

    def _path(self, f: ManifestFile) -> Path:
        return safe_join(self._root, f.path + ".sha256")

    def matches(self, f: ManifestFile, st: os.stat_result) -> bool:
        try:
            saved = json.loads(self._path(f).read_text())
        except (OSError, ValueError):
            return False
        return saved == _marker_fields(f.sha256, st)

    def write(self, f: ManifestFile, target: Path) -> None:
        fields = _marker_fields(f.sha256, target.stat())
        atomic_write_bytes(self._path(f), json.dumps(fields).encode())


def _marker_fields(sha256: str, st: os.stat_result) -> dict:
    return {
        "sha256": sha256,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
    }


def _verified_earlier(uri: str, model_dir: Path, engine: str | None) -> Manifest | None:
    """The artifact a previous container of this pod fetched from the same URI, if still intact.

    An emptyDir lives as long as its pod, and a pod's STORAGE_URI cannot change, so a container
    restarted in the same pod finds here exactly what it would fetch (KServe's storage initializer
    likewise runs once per pod). Trusting it skips boto3, the network and every hash: only the
    markers' size/mtime/ctime/inode are compared. Anything missing or touched -> the normal fetch.
    """
    try:
        if json.loads((model_dir / VERIFIED_DIR / SOURCE).read_text())["uri"] != uri:
            return None
        manifest = Manifest.load(model_dir / MANIFEST)
    except (OSError, ValueError, KeyError, TypeError, StorageError):
        return None
    markers = _Markers(model_dir)
    try:
        for f, target in resolve_files(manifest, model_dir):
            if f not in manifest.files_for(engine):
                continue
            st = target.stat()
            if not stat.S_ISREG(st.st_mode) or not markers.matches(f, st):
                return None
    except (OSError, StorageError):
        return None
    return manifest


def _is_current(f: ManifestFile, target: Path, markers: _Markers) -> bool:
    """True when ``target`` already holds exactly ``f``."""
    try:
        st = target.stat()
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != f.size:
        return False
    if markers.matches(f, st):
        return True
    # No marker, or the file changed since it was verified: the content decides.
    if sha256_file(target) != f.sha256:
        log.info("%s differs from the manifest; downloading it again", f.path)
        return False
    markers.write(f, target)
    return True


# --- parallel download ---------------------------------------------------------------------------


class _Meter:
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
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)
    hashed_to: int = 0  # bytes [0, hashed_to) are in the hash
    completed: dict[int, int] = field(default_factory=dict)  # start -> end of parts not yet hashed
    hash_lock: threading.Lock = field(default_factory=threading.Lock)

    def part_done(self, start: int, end: int) -> None:
        with self.lock:
            self.completed[start] = end
        self.advance_hash(block=False)

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
        self.close()
        self.tmp.unlink(missing_ok=True)


_HASH_CHUNK = 1 << 20  # bytes read back per hash update: big enough that hashlib releases the GIL


def _ranges(size: int, part_size: int) -> list[tuple[int, int]]:
    return [(start, min(start + part_size, size) - 1) for start in range(0, size, part_size)]


class _Downloader:
    def __init__(
        self,
        source: _Source,
        markers: _Markers,
        concurrency: int,
        part_size: int,
        policy: _RetryPolicy,
        meter: _Meter,
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
                job = self._open(f, target, len(ranges))
                jobs.append(job)
                if not ranges:
                    futures.append(pool.submit(self._finish, job))
                futures.extend(pool.submit(self._part, job, start, end) for start, end in ranges)
            wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:  # in submission order, so the error reported is deterministic
                if future.done() and not future.cancelled() and future.exception() is not None:
                    raise future.exception()
            ok = True
        finally:
            if not ok:
                self._stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            if not ok:
                for job in jobs:
                    job.discard()  # a no-op for files already renamed into place

    def _open(self, f: ManifestFile, target: Path, parts: int) -> _Job:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Temp files of a container that died mid-download would otherwise fill the emptyDir.
        for stale in target.parent.glob(f".{glob.escape(target.name)}.part-*"):
            stale.unlink(missing_ok=True)
        tmp = temp_path_for(target)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        job = _Job(file=f, target=target, tmp=tmp, fd=fd, remaining=parts)
        try:
            _preallocate(fd, f.size)
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
                    _pwrite_all(job.fd, chunk, pos)
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
        except BaseException:
            job.discard()
            raise
        fsync_dir(job.target.parent)
        self._markers.write(f, job.target)
        log.info("downloaded %s (%d bytes) in %.2fs", f.path, f.size, time.monotonic() - job.started)


def _preallocate(fd: int, size: int) -> None:
    """Reserve the space now, so a too-small emptyDir fails at the start rather than minutes in."""
    if size == 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # filesystem cannot reserve: a sparse file of the right size will do


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
