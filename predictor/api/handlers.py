"""Exception handlers: each PredictorError as its HTTP status with a JSON {"error"} body, and FastAPI's
own errors (unknown route, wrong method, parameter validation) in the same {"error"} shape."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from predictor.errors import Overloaded, PredictorError


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
    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
    return JSONResponse(status_code=400, content={"error": f"invalid request: {problems}"})
