"""Markers of files already verified in MODEL_DIR, so a restart downloads nothing it has."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from predictor.artifact.manifest import MANIFEST, Manifest, ManifestFile, resolve_files, safe_join
from predictor.errors import StorageError
from predictor.storage.files import atomic_write_bytes, sha256_file

log = logging.getLogger("predictor.artifact")

VERIFIED_DIR = ".verified"


SOURCE = "source.json"  # under VERIFIED_DIR: the URI the artifact in MODEL_DIR was fetched from


class Markers:
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
        return saved == marker_fields(f.sha256, st)

    def write(self, f: ManifestFile, target: Path) -> None:
        fields = marker_fields(f.sha256, target.stat())
        atomic_write_bytes(self._path(f), json.dumps(fields).encode())


def marker_fields(sha256: str, st: os.stat_result) -> dict:
    return {
        "sha256": sha256,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
    }


def verified_earlier(uri: str, model_dir: Path, engine: str | None) -> Manifest | None:
    """The artifact a previous container of this pod fetched from the same URI, if still intact.

    An emptyDir lives as long as its pod, and a pod's VOICE_URI cannot change, so a container
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
    markers = Markers(model_dir)
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


def is_current(f: ManifestFile, target: Path, markers: Markers) -> bool:
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
