"""One exception hierarchy for the predictor, each class carrying its HTTP and gRPC status.

Each class carries its HTTP status and the *name* of its gRPC status code, so this module needs no
grpc import (the forked fetch process never pays for one). The REST exception handler
(api/handlers.py) and the gRPC interceptor (serving/interceptor.py) read these attributes; code that
raises them never thinks about transports.

Three errors stay outside this tree on purpose, because no client ever sees them: ConfigError
(config.py: bad settings, the process exits 2 at start), ConversionError (engine/convert.py: a voice
that cannot be converted at publish time) and CompareError (tts_ops/compare.py: `tts-ops compare` exits 2).
"""

from __future__ import annotations


class PredictorError(Exception):
    http_status = 500
    grpc_status = "INTERNAL"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadRequest(PredictorError):
    """The request is wrong; retrying it unchanged cannot help."""

    http_status = 400
    grpc_status = "INVALID_ARGUMENT"


class NothingToSpeak(BadRequest):
    """The text has nothing espeak-ng can pronounce (only punctuation, symbols it skips): the same 400 on
    every route and format, never an empty or unplayable file."""


class NotFound(PredictorError):
    """A model or model version this server does not serve."""

    http_status = 404
    grpc_status = "NOT_FOUND"


class Forbidden(PredictorError):
    """The request asks for something this deployment does not allow (an event output outside
    CE_OUTPUT_PREFIXES); retrying cannot help, and nothing was written."""

    http_status = 403
    grpc_status = "PERMISSION_DENIED"


class PayloadTooLarge(BadRequest):
    """The request body is over MAX_REQUEST_BYTES: refused before it is read in full or parsed."""

    http_status = 413


class RequestTimeout(BadRequest):
    """The client took longer than BODY_TIMEOUT_S to send its body: its connection is not worth holding."""

    http_status = 408


class NotReady(PredictorError):
    """The model is not warm yet, or the server is draining: try another replica or later."""

    http_status = 503
    grpc_status = "UNAVAILABLE"


class StorageError(PredictorError):
    """Fetching the artifact failed.

    ``reason`` is the bounded label of `tts_cold_start_failures_total`: why a pod is not ready.
    """

    retryable = False
    reason = "storage"


class TransientStorageError(StorageError):
    """A failure a retry can fix: connection dropped, 5xx, throttling."""

    retryable = True
    reason = "unreachable"


class ArtifactNotFound(StorageError):
    """The manifest or an object it names does not exist."""

    reason = "not_found"


class IntegrityError(StorageError):
    """A file's size or sha256 differs from the manifest."""

    reason = "integrity"


class UnsafePath(StorageError):
    """A manifest entry would land outside MODEL_DIR."""

    reason = "unsafe_path"


class ModelDirError(StorageError):
    """MODEL_DIR cannot take the artifact: full, read-only, or not ours to write."""

    reason = "model_dir"


class ReplyTooLarge(BadRequest):
    """An event's inline audio is over CE_INLINE_MAX_BYTES; the same event will always be, so no retry."""

    http_status = 413


class OutputError(PredictorError):
    """Storage answered an event's output upload with an error (5xx, access denied): the broker retries,
    then dead-letters; the upload was multipart-aborted or never completed, so nothing half-written is visible."""

    http_status = 502
    grpc_status = "UNAVAILABLE"


class OutputUnavailable(OutputError):
    """Storage for an event's output could not be reached (refused, timed out, throttled): retry later."""

    http_status = 503


class EngineError(PredictorError):
    """The engine could not load or synthesize."""


class Overloaded(PredictorError):
    """The queue is full, or the request waited in it past REQUEST_TIMEOUT_S: shed, don't queue forever."""

    http_status = 503
    grpc_status = "UNAVAILABLE"

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[type, tuple[str, int]]:  # picklable with both arguments
        return (type(self), (self.message, self.retry_after_s))
