"""Exception handlers: each PredictorError as its HTTP status with a JSON {"error"} body."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse
from kserve.errors import ModelNotReady, ServerNotReady

from predictor.errors import Overloaded, PredictorError


# --- error mapping: the one place PredictorError meets HTTP and gRPC -------------------------
async def predictor_error_response(_request: Request, exc: PredictorError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Overloaded) else None
    return JSONResponse(status_code=exc.http_status, content={"error": exc.message}, headers=headers)


async def not_ready_response(_request: Request, exc: ModelNotReady | ServerNotReady) -> JSONResponse:
    return JSONResponse(status_code=503, content={"error": str(exc)})
