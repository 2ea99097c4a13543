"""Where shadow records go: stdout, an S3 prefix or a directory, one atomic object per batch."""

from __future__ import annotations

import logging
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

log = logging.getLogger("predictor.shadow")


# --- sinks -----------------------------------------------------------------------------------
class Sink(Protocol):
    def write(self, body: bytes) -> None:
        """Write one batch of JSONL atomically; raise on failure (the recorder retries)."""


class StdoutSink:
    def write(self, body: bytes) -> None:
        sys.stdout.buffer.write(body)
        sys.stdout.buffer.flush()


def _batch_key(revision: str) -> str:
    # Time first, so a listing reads in order; a uuid, so two pods (or two batches in one second) of
    # the same revision never overwrite each other.
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{stamp}-{revision}-{uuid.uuid4().hex[:12]}.jsonl"


class S3Sink:
    def __init__(self, bucket: str, prefix: str, revision: str, read_timeout_s: float = 60.0):
        from predictor.storage.s3 import s3_client

        self._client = s3_client(concurrency=1, read_timeout_s=read_timeout_s)
        self._bucket, self._prefix, self._revision = bucket, prefix, revision

    def write(self, body: bytes) -> None:
        from predictor.storage.uri import object_key

        key = object_key(self._prefix, _batch_key(self._revision))
        self._client.put_object(Bucket=self._bucket, Key=key, Body=body, ContentType="application/x-ndjson")


class DirSink:
    def __init__(self, root: Path, revision: str):
        self._root, self._revision = root, revision
        root.mkdir(parents=True, exist_ok=True)

    def write(self, body: bytes) -> None:
        from predictor.storage.files import atomic_write_bytes

        atomic_write_bytes(self._root / _batch_key(self._revision), body)


def open_sink(uri: str, revision: str, read_timeout_s: float = 60.0) -> Sink | None:
    """The sink SHADOW_SINK names: None (off), stdout, s3://bucket/prefix, or a local directory."""
    if not uri:
        return None
    if uri == "stdout":
        return StdoutSink()
    from predictor.storage.uri import parse_uri

    scheme, root, prefix = parse_uri(uri)
    if scheme == "s3":
        return S3Sink(root, prefix, revision, read_timeout_s)
    return DirSink(Path(root), revision)
