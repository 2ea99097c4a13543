"""A local S3 (moto's server) and the AWS environment that points boto3 at it.

moto accepts any credentials, so the ones here are placeholders, not secrets.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from testing.polling import answers
from testing.ports import free_port
from testing.process import Child, child_env

REGION = "us-east-1"
# The default voice's place in the local S3, as `make run` and the tests publish it.
VOICE_URI = "s3://voices/en_US-joe-medium"
# The same voice without inference noise (build_quiet_voice).
QUIET_VOICE_URI = "s3://voices/en_US-joe-medium-quiet"
# Variables that would override aws_env's endpoint or credentials if a developer's shell had them.
AWS_OVERRIDES = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3")
# A secret key the tests hand to predictors: it must never show up in a log line, span or metric.
SECRET = "never-log-this-secret-0123456789"


def aws_env(endpoint: str, secret_access_key: str = "testing") -> dict[str, str]:
    """The standard AWS variables pointing boto3 at ``endpoint`` with placeholder credentials."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": secret_access_key,
        "AWS_DEFAULT_REGION": REGION,
        # Keep a developer's real ~/.aws config and profile out of tests and measurements.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client on ``endpoint`` with the placeholder credentials, whatever the environment says."""
    import boto3

    env = aws_env(endpoint)
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=REGION,
    )


class MotoServer(Child):
    """moto's S3 server on 127.0.0.1 (a free port unless given), ready when constructed."""

    def __init__(self, log_path: Path | None, port: int | None = None, timeout: float = 60.0) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        super().__init__("moto", argv, child_env({}), log_path)
        self.wait_for(lambda: answers(self.endpoint + "/"), timeout, f"S3 on {self.endpoint}")


def build_voice(out_dir: Path) -> Path:
    """The packaged default voice laid out as an artifact (files + manifest.json) in ``out_dir``."""
    from predictor.artifact.publish import build_default_voice

    build_default_voice(out_dir)
    return out_dir


def build_quiet_voice(voice_dir: Path, out_dir: Path) -> Path:
    """The artifact in ``voice_dir`` with its config's inference noise set to 0, in ``out_dir``.

    The speech route takes no noise parameters, so its audio follows the voice's defaults; served
    from this copy it is deterministic and can be compared with the engine's own output. The weights
    are hard links (read-only here), config.json and manifest.json are rewritten.
    """
    import hashlib
    import json

    from predictor.artifact.manifest import MANIFEST, Manifest

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest.load(voice_dir / MANIFEST)
    files = []
    for entry in manifest.files:
        target = out_dir / entry.path
        if entry.path == "config.json":
            config = json.loads((voice_dir / entry.path).read_text())
            config["inference"] = {**config.get("inference", {}), "noise_scale": 0.0, "noise_w": 0.0}
            data = json.dumps(config, indent=2).encode()
            target.write_bytes(data)
            entry = entry.model_copy(update={"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        elif not target.exists():
            os.link(voice_dir / entry.path, target)
        files.append(entry)
    (out_dir / MANIFEST).write_text(manifest.model_copy(update={"files": files}).dumps())
    return out_dir


def publish_voice(voice_dir: Path, uri: str, endpoint: str) -> str:
    """Upload the artifact in ``voice_dir`` (see build_voice) to ``uri`` on ``endpoint``; returns ``uri``."""
    from predictor.artifact.publish import publish

    publish(voice_dir, uri, endpoint_url=endpoint)
    return uri
