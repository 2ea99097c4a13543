"""Atomic, durable local writes: temp file beside the target, fsync, rename; hashing; pwrite."""

from __future__ import annotations

import errno
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_COPY_CHUNK = 1024 * 1024


def sha256_file(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable: the directory entry lives in the directory, not the file."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path_for(target: Path) -> Path:
    """A hidden sibling of ``target``: same directory (so os.replace is atomic), never a manifest name."""
    return target.with_name(f".{target.name}.part-{uuid.uuid4().hex[:12]}")


@contextmanager
def _atomic_file(target: Path) -> Iterator[BinaryIO]:
    """A file handle whose contents appear at ``target`` only once complete and on disk."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(target)
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(target.parent)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    with _atomic_file(target) as fh:
        fh.write(data)


def atomic_copy(src: Path, target: Path, on_bytes: Callable[[int], None] | None = None) -> tuple[int, str]:
    """Copy ``src`` to ``target`` via a temp file and rename; returns (size, sha256) of what was copied."""
    digest = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, _atomic_file(target) as fout:
        while chunk := fin.read(_COPY_CHUNK):
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return size, digest.hexdigest()


def preallocate(fd: int, size: int) -> None:
    """Reserve the space now, so a too-small emptyDir fails at the start rather than minutes in."""
    if size == 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        os.ftruncate(fd, size)  # filesystem cannot reserve: a sparse file of the right size will do


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
