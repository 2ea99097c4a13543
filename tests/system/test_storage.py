"""Fetching an artifact into MODEL_DIR, against a real moto S3 server over real sockets."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

import boto3
import pytest

from predictor.artifact.download import MiB
from predictor.artifact.fetch import fetch
from predictor.artifact.manifest import MANIFEST, Manifest, ManifestFile, safe_join
from predictor.artifact.publish import publish
from predictor.artifact.verified import VERIFIED_DIR
from predictor.errors import ArtifactNotFound, IntegrityError, StorageError, TransientStorageError, UnsafePath
from predictor.storage.uri import parse_uri

VOICE_FILES = {
    "model.onnx",
    "config.json",
    "MODEL_CARD",
    "model.safetensors",
    "vits.json",
    "prior.onnx",
    "flow_0.onnx",  # the flow, one coupling layer a file
    "flow_1.onnx",
    "flow_2.onnx",
    "flow_3.onnx",
    "decoder_head.onnx",
    "decoder_tail.onnx",
}


# --- helpers ---------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(root: Path) -> list[Path]:
    """Temp files a fetch must never leave behind."""
    return [p for p in root.rglob("*") if ".part-" in p.name]


def write_artifact(root: Path, files: dict[str, bytes]) -> Manifest:
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        entries.append(ManifestFile(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
    manifest = Manifest(name="test-voice", version="0.0.1", files=entries)
    (root / MANIFEST).write_text(manifest.dumps())
    return manifest


@pytest.fixture
def s3(s3_env: str):
    return boto3.client("s3")


@pytest.fixture
def small_voice(s3_env: str, tmp_path: Path) -> tuple[str, Manifest]:
    """A 3.5 MiB two-file artifact under a fresh prefix, for tests that break things."""
    uri = f"s3://voices/test-{uuid.uuid4().hex[:8]}"
    manifest = write_artifact(
        tmp_path / "src",
        {
            "weights.bin": os.urandom(3 * MiB + MiB // 2),
            "conf/config.json": b'{"audio": {"sample_rate": 22050}}',
        },
    )
    publish(tmp_path / "src", uri)
    return uri, manifest


class FaultyProxy:
    """An HTTP/1.1 relay in front of moto that spoils the first ``faulty`` requests, then relays faithfully.

    Only ranged GETs are spoiled unless ``ranged_only=False`` (then the manifest GET is hit first).
    fault="drop": relay the response head and half its body, then close the connection mid-response.
    fault="503" / "403": answer the request itself with that S3 error and close.
    Every request head is recorded. It understands just enough HTTP for fetch: body-less GETs and
    responses framed by Content-Length.
    """

    _ERRORS: ClassVar[dict[str, tuple[str, str]]] = {
        "503": ("503 Slow Down", "SlowDown"),
        "403": ("403 Forbidden", "AccessDenied"),
    }

    def __init__(self, upstream: str, *, faulty: int = 0, fault: str = "drop", ranged_only: bool = True):
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname, parts.port)
        self._faulty = faulty
        self._fault = fault
        self._ranged_only = ranged_only
        self._spoiled = 0
        self._lock = threading.Lock()
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def ranged_gets(self) -> int:
        return sum(1 for head in self.requests if self._is_ranged(head))

    def close(self) -> None:
        self._listener.close()

    @staticmethod
    def _is_ranged(head: bytes) -> bool:
        return b"\r\nrange: bytes=" in head.lower()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _spoil(self, head: bytes) -> bool:
        with self._lock:
            self.requests.append(head)
            spoil = self._spoiled < self._faulty and (self._is_ranged(head) or not self._ranged_only)
            self._spoiled += spoil
            return spoil

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            with client, client.makefile("rb") as from_client:
                while (head := _read_head(from_client)) is not None:
                    spoil = self._spoil(head)
                    if spoil and self._fault in self._ERRORS:
                        status, code = self._ERRORS[self._fault]
                        body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                        client.sendall(
                            f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
                            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                            + body
                        )
                        return
                    if upstream is None:
                        upstream = socket.create_connection(self._upstream)
                        from_upstream = upstream.makefile("rb")
                    upstream.sendall(head)
                    response = _read_head(from_upstream)
                    length = next(
                        (
                            int(line.split(b":", 1)[1])
                            for line in response.split(b"\r\n")
                            if line.lower().startswith(b"content-length:")
                        ),
                        0,
                    )
                    body = from_upstream.read(length)
                    if spoil:  # fault == "drop": the client sees the stream end halfway
                        client.sendall(response + body[: length // 2])
                        return
                    client.sendall(response + body)
        except OSError:
            pass
        finally:
            if upstream is not None:
                upstream.close()


def _read_head(stream) -> bytes | None:
    """An HTTP message head up to and including its blank line; None at a clean end of stream."""
    head = b""
    while line := stream.readline():
        head += line
        if line == b"\r\n":
            return head
    return None


@pytest.fixture
def proxy_factory(s3_env: str):
    proxies: list[FaultyProxy] = []

    def make(**kwargs) -> FaultyProxy:
        proxies.append(FaultyProxy(s3_env, **kwargs))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


# --- happy path and restarts -----------------------------------------------------------------------


def test_fetch_from_s3_verifies_every_file(published_voice: str, s3_env: str, tmp_path: Path):
    models = tmp_path / "models"
    seen: list[int] = []

    manifest, report = fetch(published_voice, models, on_bytes=seen.append)

    assert {f.path for f in manifest.files} == VOICE_FILES
    for f in manifest.files:
        assert sha256(models / f.path) == f.sha256
    assert (report.files_total, report.files_downloaded, report.files_skipped) == (
        len(VOICE_FILES),
        len(VOICE_FILES),
        0,
    )
    assert report.bytes_downloaded == sum(seen) == manifest.total_bytes
    assert Manifest.load(models / MANIFEST) == manifest
    assert leftovers(models) == []


def test_restart_skips_verified_files(published_voice: str, s3_env: str, tmp_path: Path):
    models = tmp_path / "models"
    fetch(published_voice, models)

    _, report = fetch(published_voice, models)

    assert (report.files_skipped, report.files_downloaded, report.bytes_downloaded) == (
        len(VOICE_FILES),
        0,
        0,
    )


def test_restart_in_the_same_pod_needs_no_network(
    published_voice: str, s3_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    models = tmp_path / "models"
    fetch(published_voice, models)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: nothing answers

    manifest, report = fetch(published_voice, models)

    assert manifest.name == "en_US-joe-medium"
    assert (report.files_skipped, report.bytes_downloaded) == (len(VOICE_FILES), 0)


def test_engine_filter_fetches_only_that_engines_files(published_voice: str, s3_env: str, tmp_path: Path):
    models = tmp_path / "models"

    _, report = fetch(published_voice, models, engine="torch")

    assert report.files_downloaded == 4
    assert (models / "model.safetensors").exists() and not (models / "model.onnx").exists()
    _, again = fetch(published_voice, models, engine="onnx")  # a restart with another engine
    # the graph's parts (prior, the flow's four coupling layers, decoder head and tail); config, card
    # and vits.json kept
    assert (again.files_downloaded, again.files_skipped) == (7, 3)


def test_another_uri_is_fetched_even_if_files_match(published_voice: str, s3_env: str, tmp_path: Path):
    models = tmp_path / "models"
    fetch(published_voice, models)

    with pytest.raises(ArtifactNotFound):
        fetch("s3://voices/somewhere-else", models)


def test_restart_without_markers_rehashes_and_skips(published_voice: str, s3_env: str, tmp_path: Path):
    models = tmp_path / "models"
    fetch(published_voice, models)
    shutil.rmtree(models / VERIFIED_DIR)

    _, report = fetch(published_voice, models)

    assert (report.files_skipped, report.bytes_downloaded) == (len(VOICE_FILES), 0)
    assert (models / VERIFIED_DIR / "model.onnx.sha256").exists()


def test_locally_modified_file_is_downloaded_again(published_voice: str, s3_env: str, tmp_path: Path):
    models = tmp_path / "models"
    manifest, _ = fetch(published_voice, models)
    config = models / "config.json"
    data = bytearray(config.read_bytes())
    data[10] ^= 0xFF  # same size, different content
    config.write_bytes(bytes(data))
    (models / "MODEL_CARD").unlink()

    _, report = fetch(published_voice, models)

    assert (report.files_downloaded, report.files_skipped) == (2, len(VOICE_FILES) - 2)
    expected = {f.path: f.sha256 for f in manifest.files}
    assert sha256(config) == expected["config.json"]
    assert sha256(models / "MODEL_CARD") == expected["MODEL_CARD"]


def test_fetch_from_file_uri(voice_dir: Path, tmp_path: Path):
    published = tmp_path / "published"
    publish(voice_dir, f"file://{published}")

    for uri in (f"file://{published}", str(published)):
        models = tmp_path / f"models-{len(uri)}"
        manifest, report = fetch(uri, models, part_size=16 * MiB)

        assert report.files_downloaded == len(VOICE_FILES)
        for f in manifest.files:
            assert sha256(models / f.path) == f.sha256


def test_small_part_size_uses_many_ranged_gets(published_voice: str, proxy_factory, tmp_path: Path):
    proxy = proxy_factory()
    models = tmp_path / "models"

    manifest, _ = fetch(published_voice, models, part_size=1 * MiB, endpoint_url=proxy.url)

    assert proxy.ranged_gets == sum(math.ceil(f.size / MiB) for f in manifest.files)
    for f in manifest.files:
        assert sha256(models / f.path) == f.sha256


# --- what goes wrong -------------------------------------------------------------------------------


def test_corrupted_object_is_caught(small_voice, s3, tmp_path: Path):
    uri, manifest = small_voice
    _, bucket, prefix = parse_uri(uri)
    size = next(f.size for f in manifest.files if f.path == "weights.bin")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/weights.bin", Body=os.urandom(size))
    models = tmp_path / "models"

    with pytest.raises(IntegrityError, match=r"weights\.bin.*sha256"):
        fetch(uri, models, part_size=1 * MiB)

    assert not (models / "weights.bin").exists()
    assert not (models / MANIFEST).exists()
    assert leftovers(models) == []


def test_object_of_wrong_size_is_caught(small_voice, s3, tmp_path: Path):
    uri, _ = small_voice
    _, bucket, prefix = parse_uri(uri)
    s3.put_object(Bucket=bucket, Key=f"{prefix}/weights.bin", Body=b"too short")
    models = tmp_path / "models"

    with pytest.raises(IntegrityError, match=r"weights\.bin"):
        fetch(uri, models, part_size=1 * MiB)

    assert not (models / "weights.bin").exists()
    assert leftovers(models) == []


@pytest.mark.parametrize(
    "bad_path",
    ["../evil", "/abs/evil", "a/../../evil", "a\\evil", "a//b", "", ".verified/x.sha256", MANIFEST],
)
def test_traversal_key_is_refused(bad_path: str, s3, tmp_path: Path):
    prefix = f"hostile-{uuid.uuid4().hex[:8]}"
    good = ManifestFile(path="ok.bin", size=2, sha256=hashlib.sha256(b"ok").hexdigest())
    evil = ManifestFile(path=bad_path, size=4, sha256=hashlib.sha256(b"evil").hexdigest())
    s3.create_bucket(Bucket="hostile")
    s3.put_object(Bucket="hostile", Key=f"{prefix}/ok.bin", Body=b"ok")
    s3.put_object(
        Bucket="hostile",
        Key=f"{prefix}/{MANIFEST}",
        Body=Manifest(name="x", version="1", files=[good, evil]).dumps(),
    )
    models = tmp_path / "deep" / "models"

    with pytest.raises(UnsafePath):
        fetch(f"s3://hostile/{prefix}", models)

    assert not models.exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


def test_symlink_out_of_model_dir_is_refused(tmp_path: Path):
    root = tmp_path / "models"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)

    with pytest.raises(UnsafePath):
        safe_join(root, "link/evil")


def test_missing_manifest_is_reported(s3, tmp_path: Path):
    s3.create_bucket(Bucket="voices")

    with pytest.raises(ArtifactNotFound, match=r"s3://voices/no-such-voice/manifest\.json"):
        fetch("s3://voices/no-such-voice", tmp_path / "models")
    with pytest.raises(ArtifactNotFound, match="no-such-bucket"):
        fetch("s3://no-such-bucket/voice", tmp_path / "models")
    with pytest.raises(ArtifactNotFound, match=r"manifest\.json"):
        fetch(str(tmp_path / "nowhere"), tmp_path / "models")


def test_missing_object_is_reported(small_voice, s3, tmp_path: Path):
    uri, _ = small_voice
    _, bucket, prefix = parse_uri(uri)
    s3.delete_object(Bucket=bucket, Key=f"{prefix}/conf/config.json")
    models = tmp_path / "models"

    with pytest.raises(ArtifactNotFound, match=f"s3://{bucket}/{prefix}/conf/config.json"):
        fetch(uri, models, retries=5, backoff_s=0.01)

    assert leftovers(models) == []
    assert not (models / "conf" / "config.json").exists()


@pytest.mark.parametrize("ranged_only", [True, False], ids=["parts", "manifest"])
@pytest.mark.parametrize("fault", ["drop", "503"])
def test_dropped_connection_is_retried(
    fault: str, ranged_only: bool, small_voice, proxy_factory, tmp_path: Path
):
    uri, manifest = small_voice
    proxy = proxy_factory(faulty=3, fault=fault, ranged_only=ranged_only)
    models = tmp_path / "models"

    _, report = fetch(uri, models, part_size=1 * MiB, retries=3, backoff_s=0.01, endpoint_url=proxy.url)

    assert report.files_downloaded == 2
    assert report.bytes_downloaded == manifest.total_bytes  # a resumed part is not counted twice
    for f in manifest.files:
        assert sha256(models / f.path) == f.sha256
    parts = sum(math.ceil(f.size / MiB) for f in manifest.files)
    assert len(proxy.requests) == 1 + parts + 3  # manifest, every part, one retry per spoiled request
    assert leftovers(models) == []


@pytest.mark.parametrize("fault", ["drop", "503"])
def test_retries_exhausted_raise_transient_error(fault: str, small_voice, proxy_factory, tmp_path: Path):
    uri, _ = small_voice
    proxy = proxy_factory(faulty=1, fault=fault)
    models = tmp_path / "models"

    with pytest.raises(TransientStorageError, match="gave up after 1 attempts"):
        fetch(uri, models, part_size=1 * MiB, retries=0, backoff_s=0.01, endpoint_url=proxy.url)

    assert leftovers(models) == []
    assert not (models / MANIFEST).exists()


def test_forbidden_is_not_retried(small_voice, proxy_factory, tmp_path: Path):
    uri, _ = small_voice
    proxy = proxy_factory(faulty=1, fault="403", ranged_only=False)

    with pytest.raises(StorageError, match="access denied") as caught:
        fetch(uri, tmp_path / "models", retries=5, backoff_s=0.01, endpoint_url=proxy.url)

    assert not isinstance(caught.value, TransientStorageError)
    assert len(proxy.requests) == 1


# --- URIs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://voices/en_US-joe-medium", ("s3", "voices", "en_US-joe-medium")),
        ("s3://voices/a/b/", ("s3", "voices", "a/b")),
        ("s3://voices", ("s3", "voices", "")),
        ("file:///srv/voices/joe", ("file", "/srv/voices/joe", "")),
        ("/srv/voices/joe", ("file", "/srv/voices/joe", "")),
    ],
)
def test_supported_uris_are_parsed(uri: str, expected: tuple[str, str, str]):
    assert parse_uri(uri) == expected


@pytest.mark.parametrize("uri", ["", "gs://bucket/x", "https://host/x", "s3:///no-bucket", "file://host/x"])
def test_unsupported_uris_are_refused(uri: str):
    with pytest.raises(StorageError, match="expected s3://bucket/prefix"):
        parse_uri(uri)
