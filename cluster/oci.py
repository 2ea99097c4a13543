"""OCI image archives made from a few files (static Go binaries), for `ctr -n k8s.io images import`:
the cluster's sandbox (pause) image and the images of what runs as pods, with no registry and no
image builder. The archive carries both the OCI layout (index.json) and Docker's manifest.json with
RepoTags, so containerd names the image from either."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted({str(Path(p).parent) for p in files} - {"."})
        for directory in directories:
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_archive(out: Path, name: str, files: dict[str, tuple[bytes, int]], entrypoint: list[str]) -> Path:
    """One-layer image `name` (e.g. dev.local/ttsk8s/tiny:1) holding `files` (path -> data, mode)."""
    layer = _tar_bytes(files)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "User": "65532:65532", "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": _digest(layer), "size": len(layer)}],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    ).encode()
    blob = {_digest(b)[7:]: b for b in (layer, config, manifest)}
    docker = json.dumps(
        [
            {
                "Config": f"blobs/sha256/{_digest(config)[7:]}",
                "RepoTags": [name],
                "Layers": [f"blobs/sha256/{_digest(layer)[7:]}"],
            }
        ]
    ).encode()
    entries = {"oci-layout": (b'{"imageLayoutVersion": "1.0.0"}', 0o644), "index.json": (index, 0o644)}
    entries["manifest.json"] = (docker, 0o644)
    for hexdigest, data in blob.items():
        entries[f"blobs/sha256/{hexdigest}"] = (data, 0o644)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(_tar_bytes(entries))
    tmp.rename(out)
    return out
