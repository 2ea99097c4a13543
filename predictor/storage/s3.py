"""The one S3 client factory, and the one translation of botocore's errors into ours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Codes S3 (and S3-compatible stores) answer when it sheds load: the caller should slow down.
THROTTLED_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "ServiceUnavailable", "RequestLimitExceeded"}
)
# Codes after which the same request may succeed when repeated (a fetch retries its part).
TRANSIENT_CODES = THROTTLED_CODES | {"RequestTimeout", "InternalError"}
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
DENIED_CODES = frozenset({"AccessDenied", "403"})
PRECONDITION_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})


@dataclass(frozen=True)
class S3Failure:
    """What a botocore ClientError means, decided once for every caller (fetch, outputs, sinks)."""

    code: str
    status: int
    detail: str  # "<code or status> <message>", for error messages

    @property
    def not_found(self) -> bool:
        return self.status == 404 or self.code in NOT_FOUND_CODES

    @property
    def denied(self) -> bool:
        return self.status == 403 or self.code in DENIED_CODES

    @property
    def bad_range(self) -> bool:
        return self.status == 416 or self.code == "InvalidRange"

    @property
    def precondition_failed(self) -> bool:
        return self.status == 412 or self.code in PRECONDITION_CODES

    @property
    def throttled(self) -> bool:
        """The store is shedding load (503, 429, SlowDown...): come back later."""
        return self.status in (429, 503) or self.code in THROTTLED_CODES

    @property
    def transient(self) -> bool:
        """Throttled or failing on the server's side: repeating the same request can succeed."""
        return self.status >= 500 or self.throttled or self.code in TRANSIENT_CODES


def failure(exc: Any) -> S3Failure:
    """The meaning of a botocore ClientError (anything with its `.response` dict)."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return S3Failure(code, status, f"{code or status} {error.get('Message', '')}".strip())


def s3_client(*, concurrency: int, endpoint_url: str | None = None, read_timeout_s: float = 60.0) -> Any:
    """One S3 client for all threads (boto3 clients are thread-safe), with a connection per worker.

    botocore's own retries are off (one attempt in total): fetch retries per part and resumes where a
    dropped stream stopped, which botocore cannot do. ``read_timeout_s`` (S3_READ_TIMEOUT_S) is how
    long a connection may stay silent before it counts as dropped: what a stalled store costs.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        max_pool_connections=concurrency + 2,
        retries={"total_max_attempts": 1},
        connect_timeout=10,
        read_timeout=read_timeout_s,
    )
    # A session of our own: the default one behind boto3.client() is shared process-wide state.
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
