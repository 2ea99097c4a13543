"""Exception handlers: each PredictorError as its HTTP status with a JSON {"error"} body."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from predictor.errors import Overloaded, PredictorError


async def predictor_error_response(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PredictorError)  # registered for PredictorError only
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Overloaded) else None
    return JSONResponse(status_code=exc.http_status, content={"error": exc.message}, headers=headers)


async def not_ready_response(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=503, content={"error": str(exc)})
