"""Request ids and the revision header on every response: the keys shadow records are joined by."""

from __future__ import annotations

import uuid

REQUEST_ID_HEADER = "x-request-id"


REVISION_HEADER = "x-tts-revision"


def request_id(incoming: str | None) -> str:
    """The caller's id if it is a sane token (it is copied into logs and records), else a fresh uuid4."""
    if (
        incoming
        and len(incoming) <= 200
        and incoming.isascii()
        and incoming.isprintable()
        and " " not in incoming
    ):
        return incoming
    return str(uuid.uuid4())
