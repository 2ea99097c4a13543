"""Exception handlers: each PredictorError as its HTTP status with a JSON {"error"} body, and FastAPI's
own errors (unknown route, wrong method, parameter validation) in the same {"error"} shape; the one
formatter of pydantic's validation errors every route's 400 uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from predictor.errors import Overloaded, PredictorError

# The first few problems are enough to fix a request; a body with hundreds would bury them.
MAX_PROBLEMS = 5


def validation_problems(errors: Sequence[Any]) -> str:
    """pydantic's errors as one line, "where: what; ..." ("body" where the body itself is wrong), for
    every route's 400: FastAPI's parameter validation, the speech body, the v2 JSON body."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in list(errors)[:MAX_PROBLEMS]
    )


async def predictor_error_response(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PredictorError)  # registered for PredictorError only
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Overloaded) else None
    return JSONResponse(status_code=exc.http_status, content={"error": exc.message}, headers=headers)


async def not_ready_response(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=503, content={"error": str(exc)})


async def http_exception_response(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse(status_code=exc.status_code, content={"error": str(exc.detail)}, headers=exc.headers)


async def validation_error_response(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(
        status_code=400, content={"error": f"invalid request: {validation_problems(exc.errors())}"}
    )
