"""Storage URIs: s3://bucket/prefix and local paths, parsed and checked in one place."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from predictor.errors import StorageError


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
