"""Durable event outputs: an event's audio lands in S3 exactly once, however often the bus redelivers it.

An event with ``data.output = s3://bucket/dir/name.wav`` is completed in this order:

1. the audio goes to ``dir/name.wav`` as a multipart upload (parts of CE_OUTPUT_PART_SIZE_MIB; one
   part for most outputs), carrying the event's key and the reply's fields in its user metadata;
2. a completion record, ``dir/.tts-events/<event key>.json``, holds the reply.

The event key is sha256 of the event's (source, id), which CloudEvents makes unique per event and
Knative keeps across retries. A redelivery looks for the record first and replies from it, without
synthesizing or writing anything. A crash between 1 and 2 leaves the object without its record; the
redelivery then finds the object's metadata naming this event, rebuilds the reply from it and writes
the record, still without a second object. Within one process, duplicates that arrive while the first
delivery is in flight wait for it and share its reply. Across replicas, a write to a key that was
free when looked up is conditional (If-None-Match: *): of two replicas racing on one event, the second
to finish finds the first one's object, replies from it and writes nothing.

A failure reply is final. Nothing of an upload is visible until its completion, and an upload that
failed is aborted before the event is answered; once S3 has aborted it, no request of it still on the
wire (a part or the completion itself, delayed by a stalled link) can make the object appear. If the
abort finds the upload gone because its completion did land, the object is this event's and the event
succeeds. Only when the abort cannot reach S3 either may a completion still land after the error
reply; that object carries the event's key, so the redelivery replies from it and writes nothing
twice. A single PUT could not offer this: a PUT whose answer was lost may still be applied later.

The record lives next to the output (not at a fixed bucket-wide prefix) so that a bucket policy that
lets the predictor write the output's prefix also covers the record. A redelivery is therefore found
only if it names an output in the same directory; reusing an event id with data naming another
directory is a producer bug CloudEvents forbids, and is treated as a new event.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from predictor.config import Settings
from predictor.errors import BadRequest, OutputError, OutputUnavailable, StorageError
from predictor.observability import metrics
from predictor.storage.s3 import failure, s3_client
from predictor.storage.uri import parse_uri

log = logging.getLogger("predictor.outputs")

RECORD_DIR = ".tts-events"
RECORD_VERSION = 1
# S3 user metadata on the audio object: enough to rebuild the reply if the record was never written.
_META_EVENT = "tts-event"
_META_SHA256 = "tts-sha256"
_META_SECONDS = "tts-audio-seconds"
_META_RATE = "tts-sample-rate"
_META_FORMAT = "tts-format"
# Answers that mean "storage is overloaded or briefly down", as opposed to "storage refused this".


@dataclass(frozen=True)
class OutputTarget:
    bucket: str
    key: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def record_key(self, event_key: str) -> str:
        directory = self.key.rsplit("/", 1)[0] + "/" if "/" in self.key else ""
        return f"{directory}{RECORD_DIR}/{event_key}.json"


@dataclass(frozen=True)
class EncodedAudio:
    data: bytes
    format: str
    media_type: str
    sample_rate: int  # of the encoded file, which a codec may have resampled
    audio_seconds: float

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class Completion:
    """What a reply event carries: its data, and the time the work was done (the same on every redelivery)."""

    data: dict[str, Any]
    time: str


def parse_output_uri(uri: Any) -> OutputTarget:
    """``s3://bucket/key`` naming one object; BadRequest otherwise (the event is wrong, not storage)."""
    expected = "data.output must be an s3://bucket/key URI naming one object"
    if not isinstance(uri, str) or not uri:
        raise BadRequest(f"{expected}, got {uri!r}")
    try:
        scheme, bucket, key = parse_uri(uri)
    except StorageError as exc:
        raise BadRequest(f"{expected}: {exc.message}") from None
    if scheme != "s3" or not key or uri.endswith("/"):
        raise BadRequest(f"{expected}, got {uri!r}")
    if f"/{RECORD_DIR}/" in f"/{key}":
        raise BadRequest(f"data.output may not lie under {RECORD_DIR}/, where completion records live")
    return OutputTarget(bucket=bucket, key=key)


def event_key(source: str, event_id: str) -> str:
    """Deterministic key of one event: the same for every redelivery, different for any other event."""
    return hashlib.sha256(json.dumps([source, event_id]).encode()).hexdigest()


def now_iso() -> str:
    return iso(datetime.now(UTC))


def iso(when: datetime) -> str:
    """RFC 3339 in UTC, as CloudEvents' `time` attribute wants it."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def output_data(target: OutputTarget, audio: EncodedAudio) -> dict[str, Any]:
    return {
        "uri": target.uri,
        "sha256": audio.sha256,
        "bytes": len(audio.data),
        "audio_seconds": audio.audio_seconds,
        "sample_rate": audio.sample_rate,
        "format": audio.format,
    }


class _LostRace(Exception):
    """A create-only write found the key taken: someone else wrote it after we looked."""


# What _find says when the event has no completion yet: the output key is free, or holds another
# event's object (which this event will replace).
_ABSENT, _TAKEN = object(), object()


class OutputStore:
    """Completes events with S3 outputs, once each; one per process (it holds the in-flight table)."""

    def __init__(self, settings: Settings):
        self._part_size = settings.ce_output_part_size_mib * 1024 * 1024
        self._read_timeout_s = settings.s3_read_timeout_s
        self._client = None
        self._client_lock = threading.Lock()
        self._in_flight: dict[str, asyncio.Future[Completion]] = {}

    async def complete(
        self,
        target: OutputTarget,
        key: str,
        request_sha256: str,
        produce: Callable[[], Awaitable[EncodedAudio]],
    ) -> Completion:
        """The event's completion: from storage if it was done before, else produce, upload and record it."""
        pending = self._in_flight.get(key)
        if pending is not None:
            metrics.EVENT_OUTPUTS.labels("joined").inc()
        else:
            pending = asyncio.ensure_future(self._complete_once(target, key, request_sha256, produce))
            self._in_flight[key] = pending
            pending.add_done_callback(lambda f: self._finished(key, f))
        # Shielded: a caller that hangs up must not cancel the work the other duplicates wait for.
        return await asyncio.shield(pending)

    def _finished(self, key: str, future: asyncio.Future[Completion]) -> None:
        self._in_flight.pop(key, None)
        if not future.cancelled():
            future.exception()  # retrieved here, so a failure nobody awaited any more is not logged as lost

    async def _complete_once(
        self,
        target: OutputTarget,
        key: str,
        request_sha256: str,
        produce: Callable[[], Awaitable[EncodedAudio]],
    ) -> Completion:
        try:
            found = await asyncio.to_thread(self._find, target, key, request_sha256)
            if isinstance(found, Completion):
                return found
            audio = await produce()
            try:
                return await asyncio.to_thread(
                    self._write, target, key, request_sha256, audio, found is _ABSENT
                )
            except _LostRace:
                # Another replica created the object while we synthesized: it is this event's (or the
                # next lookup says whose), and ours is discarded rather than written a second time.
                again = await asyncio.to_thread(self._find, target, key, request_sha256)
                if isinstance(again, Completion):
                    metrics.EVENT_OUTPUTS.labels("raced").inc()
                    return again
                raise OutputUnavailable(
                    f"output {target.uri} was created by another event while this one was synthesized; retry"
                ) from None
        except OutputError as exc:
            # The broker retries this and finally dead-letters it; the log says why.
            log.warning("event output failed: %s", exc.message, extra={"event_key": key, "uri": target.uri})
            raise

    # --- blocking S3 calls, on worker threads -----------------------------------------------
    def _s3(self) -> Any:
        # Created on the first output event, not at start: boto3's import and client cost stay off
        # the cold start of predictors that never see one.
        with self._client_lock:
            if self._client is None:
                self._client = s3_client(concurrency=8, read_timeout_s=self._read_timeout_s)
            return self._client

    def _find(self, target: OutputTarget, key: str, request_sha256: str) -> Completion | object:
        """The event's completion if storage has it; otherwise whether the output key is _ABSENT or _TAKEN."""
        client = self._s3()
        with _translated(target):
            record = _get_json(client, target.bucket, target.record_key(key))
        if record is not None:
            if record.get("request_sha256") != request_sha256:
                log.warning(
                    "event redelivered with different data; replying from its completion record",
                    extra={"event_key": key, "uri": target.uri},
                )
            metrics.EVENT_OUTPUTS.labels("replayed").inc()
            log.info(
                "event already completed; replying from its record",
                extra={"event_key": key, "uri": target.uri},
            )
            return Completion(data=record["reply"], time=record["completed_at"])
        with _translated(target):
            head = _head(client, target.bucket, target.key)
        if head is None:
            return _ABSENT
        if head.get("Metadata", {}).get(_META_EVENT) != key:
            return _TAKEN  # an earlier event's output at the same key: this event replaces it
        # The object was written for this event but its record was not (the process died in between).
        meta = head["Metadata"]
        data = {
            "uri": target.uri,
            "sha256": meta[_META_SHA256],
            "bytes": int(head["ContentLength"]),
            "audio_seconds": float(meta[_META_SECONDS]),
            "sample_rate": int(meta[_META_RATE]),
            "format": meta[_META_FORMAT],
        }
        completed_at = iso(head["LastModified"])
        self._put_record(target, key, request_sha256, data, completed_at)
        metrics.EVENT_OUTPUTS.labels("recovered").inc()
        log.info(
            "event's output found without its record; record rebuilt",
            extra={"event_key": key, "uri": target.uri},
        )
        return Completion(data=data, time=completed_at)

    def _write(
        self, target: OutputTarget, key: str, request_sha256: str, audio: EncodedAudio, create_only: bool
    ) -> Completion:
        metadata = {
            _META_EVENT: key,
            _META_SHA256: audio.sha256,
            _META_SECONDS: repr(audio.audio_seconds),
            _META_RATE: str(audio.sample_rate),
            _META_FORMAT: audio.format,
        }
        with _translated(target):
            self._upload(target, audio, metadata, create_only)
        data = output_data(target, audio)
        completed_at = now_iso()
        self._put_record(target, key, request_sha256, data, completed_at)
        metrics.EVENT_OUTPUTS.labels("written").inc()
        log.info(
            "event output written", extra={"event_key": key, "uri": target.uri, "bytes": len(audio.data)}
        )
        return Completion(data=data, time=completed_at)

    def _upload(
        self, target: OutputTarget, audio: EncodedAudio, metadata: dict[str, str], create_only: bool
    ) -> None:
        """A multipart upload, of one part or more; visible only once complete (see the module's doc).

        ``create_only`` (the key was free when we looked) makes the completion conditional on the key
        still being free (If-None-Match: *), so two replicas racing on one event cannot both write it.
        s3transfer's managed upload cannot pass that condition, hence the parts by hand.
        """
        from botocore.exceptions import ClientError

        client = self._s3()
        where = {"Bucket": target.bucket, "Key": target.key}
        condition = {"IfNoneMatch": "*"} if create_only else {}
        try:
            upload_id = client.create_multipart_upload(
                **where, ContentType=audio.media_type, Metadata=metadata
            )["UploadId"]
            try:
                parts = []
                for number, start in enumerate(range(0, max(len(audio.data), 1), self._part_size), start=1):
                    chunk = audio.data[start : start + self._part_size]
                    etag = client.upload_part(**where, UploadId=upload_id, PartNumber=number, Body=chunk)[
                        "ETag"
                    ]
                    parts.append({"ETag": etag, "PartNumber": number})
                client.complete_multipart_upload(
                    **where, UploadId=upload_id, MultipartUpload={"Parts": parts}, **condition
                )
            except BaseException as exc:
                if self._landed_after_all(target, upload_id, metadata, exc):
                    return
                raise
        except ClientError as exc:
            if create_only and failure(exc).precondition_failed:
                raise _LostRace() from exc
            raise

    def _landed_after_all(
        self, target: OutputTarget, upload_id: str, metadata: dict[str, str], exc: BaseException
    ) -> bool:
        """After a failed upload: abort it, so that nothing of it can land later; True if it had landed.

        The abort also frees the parts, which are invisible but billed until aborted. An abort that
        finds no such upload means the completion got through although its answer was lost; the object
        then holds this event's audio (same key and sha256 in its metadata) and the write succeeded.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        client = self._s3()
        where = {"Bucket": target.bucket, "Key": target.key}
        try:
            client.abort_multipart_upload(**where, UploadId=upload_id)
            return False  # aborted: this upload can never complete now
        except ClientError as abort_exc:
            if failure(abort_exc).code != "NoSuchUpload":
                log.warning("could not abort a failed upload: %s", failure(abort_exc).detail)
                return False
        except BotoCoreError as abort_exc:
            # S3 unreachable: a completion still on the wire may land later; it carries this event's
            # key, so the redelivery replies from it instead of writing a second object.
            log.warning("could not abort a failed upload: %s", abort_exc)
            return False
        try:
            head = client.head_object(**where)
        except (ClientError, BotoCoreError):
            return False
        landed = head.get("Metadata", {})
        if (
            landed.get(_META_EVENT) == metadata[_META_EVENT]
            and landed.get(_META_SHA256) == metadata[_META_SHA256]
        ):
            log.info("the output's completion landed though its answer was lost (%s)", exc)
            return True
        return False

    def _put_record(
        self, target: OutputTarget, key: str, request_sha256: str, data: dict[str, Any], completed_at: str
    ) -> None:
        record = {
            "version": RECORD_VERSION,
            "request_sha256": request_sha256,
            "completed_at": completed_at,
            "reply": data,
        }
        with _translated(target):
            self._s3().put_object(
                Bucket=target.bucket,
                Key=target.record_key(key),
                Body=json.dumps(record).encode(),
                ContentType="application/json",
            )


def _get_json(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    found = _unless_missing(lambda: client.get_object(Bucket=bucket, Key=key))
    return None if found is None else json.loads(found["Body"].read())


def _head(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    return _unless_missing(lambda: client.head_object(Bucket=bucket, Key=key))


def _unless_missing(call: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """The call's answer, or None when the object does not exist."""
    from botocore.exceptions import ClientError

    try:
        return call()
    except ClientError as exc:
        if failure(exc).not_found:
            return None
        raise


@contextmanager
def _translated(target: OutputTarget) -> Iterator[None]:
    """botocore's errors as ours: what the bus should retry (5xx) and what it must not (4xx)."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    where = f"output {target.uri}"
    try:
        yield
    except ClientError as exc:
        f = failure(exc)
        detail = f.detail
        if f.code == "NoSuchBucket":
            raise BadRequest(f"{where}: bucket {target.bucket!r} does not exist") from exc
        if f.throttled:
            raise OutputUnavailable(f"{where}: storage is busy ({detail}); retry later") from exc
        if f.denied:
            raise OutputError(
                f"{where}: access denied ({detail}); check the predictor's credentials and bucket policy"
            ) from exc
        raise OutputError(f"{where}: storage answered {detail}") from exc
    except (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError) as exc:
        raise OutputUnavailable(f"{where}: storage unreachable ({exc}); retry later") from exc
    except BotoCoreError as exc:
        raise OutputError(f"{where}: upload failed ({exc})") from exc
