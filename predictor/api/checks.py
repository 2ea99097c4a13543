"""The checks of what a request names, shared by every route (v2 REST and gRPC, Triton's stream, v1 and
CloudEvents, readiness): the model and the model version. Readiness and the request's parameters
(voice, seed) are the service's checks (TTSService.require_ready, check_params), made once per
request: the service remembers on the request's admission what it has already checked."""

from __future__ import annotations

from predictor.errors import NotFound


def require_model(model_name: str, served: str) -> None:
    if model_name != served:
        raise NotFound(f"model {model_name!r} is not served here; this server serves {served!r}")


def require_version(version: str | None, served: str) -> None:
    """A request naming a model version: the served one answers as unversioned, any other is 404.

    One version per process (a revision serves one artifact); KServe's own versioned routes answer 501.
    Empty means unversioned, as in the gRPC messages, whose version fields default to "".
    """
    if version and version != served:
        raise NotFound(f"model version {version!r} is not served here; this server serves version {served!r}")
