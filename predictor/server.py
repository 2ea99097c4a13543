"""The predictor process: KServe's REST and gRPC servers around our model, cold start, drain.

Cold start, in the order it overlaps (the CLI starts the first two before importing this module):

    thread 1: fetch the artifact into MODEL_DIR          ─┐
    thread 2: construct the engine (imports, phonemizer)  ├─> load -> warm-up -> ready
    main:     import KServe, bind ports, answer liveness ─┘

Readiness is the model's: /v2/models/{name}/ready, /v1/models/{name} and also /v2/health/ready (which
KServe answers `true` as soon as the process runs, before any model is warm; we answer it from the
model) stay 503 until the warm-up synthesis has run. Liveness (/v2/health/live) is 200 throughout.

SIGTERM: readiness drops to 503 and new requests are refused (503 / UNAVAILABLE), in-flight requests
finish (up to DRAIN_TIMEOUT_S), then both servers stop and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import warnings
from concurrent.futures import Future
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import FastAPIDeprecationWarning
from fastapi.responses import JSONResponse, Response
from grpc import StatusCode, aio
from kserve.errors import ModelNotFound, ModelNotReady, ServerNotReady
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.infer_type import InferRequest
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.server import RESTServer
from opentelemetry import trace

from predictor import events, metrics, shadow, speech, tracing
from predictor.coldstart import ColdStart
from predictor.config import ConfigError, Settings
from predictor.endpoints import (
    BINARY_HEADER,
    INPUT_METADATA,
    OUTPUT_METADATA,
    TTSModel,
    decode_binary_request,
    decode_v2,
    encode_rest,
    parse_inference_request,
    parse_v1,
    v1_predictions,
)
from predictor.errors import BadRequest, NotReady, Overloaded, PredictorError, StorageError
from predictor.outputs import OutputStore
from predictor.service import TTSService

log = logging.getLogger("predictor.server")

# KServe's FastAPI app declares ORJSONResponse as its default response class, which FastAPI now
# deprecates; the warning would land in every pod's log on its first request and says nothing to users.
warnings.filterwarnings("ignore", category=FastAPIDeprecationWarning)


# --- error mapping: the one place PredictorError meets HTTP and gRPC -------------------------
async def _http_error(_request: Request, exc: PredictorError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Overloaded) else None
    return JSONResponse(status_code=exc.http_status, content={"error": exc.message}, headers=headers)


async def _not_ready(_request: Request, exc: ModelNotReady | ServerNotReady) -> JSONResponse:
    return JSONResponse(status_code=503, content={"error": str(exc)})


# Routes whose requests leave a shadow record (REST route templates, gRPC methods).
SYNTHESIS_ROUTES = frozenset(
    {"/v2/models/{model_name}/infer", "/v1/models/{model_name}:predict", "/v1/audio/speech"}
)
GRPC_SYNTHESIS_METHODS = frozenset({"ModelInfer"})
# Shadow records carry HTTP statuses, so compare can count errors alike across REST and gRPC.
_GRPC_AS_HTTP = {
    StatusCode.OK: 200,
    StatusCode.INVALID_ARGUMENT: 400,
    StatusCode.NOT_FOUND: 404,
    StatusCode.UNAVAILABLE: 503,
    StatusCode.UNIMPLEMENTED: 501,
}


class _GrpcErrors(ExceptionToStatusInterceptor):
    """KServe's mapping plus ours, a request counter by method and final status, request ids in the
    initial metadata and a shadow record per ModelInfer."""

    def __init__(self, revision: str, recorder: shadow.Recorder | None):
        super().__init__()
        self._revision = revision
        self._recorder = recorder

    async def intercept(self, method, request_or_iterator, context, method_name):
        code = StatusCode.OK
        name = method_name.rsplit("/", 1)[-1]
        incoming = dict(context.invocation_metadata() or ()).get(shadow.REQUEST_ID_HEADER)
        rid = shadow.request_id(incoming if isinstance(incoming, str) else None)
        await context.send_initial_metadata(
            ((shadow.REQUEST_ID_HEADER, rid), (shadow.REVISION_HEADER, self._revision))
        )
        started = time.perf_counter()
        # Audio is captured only for calls that will leave a record, as in the REST middleware.
        recorded = self._recorder is not None and name in GRPC_SYNTHESIS_METHODS
        captured, token = shadow.begin() if recorded else (None, None)
        try:
            return await super().intercept(method, request_or_iterator, context, method_name)
        except BaseException:
            code = context.code() or StatusCode.UNKNOWN
            raise
        finally:
            route = "grpc:" + name
            metrics.REQUESTS.labels(route, code.name).inc()
            if code != StatusCode.OK:
                metrics.ERRORS.labels(route, code.name).inc()
            if recorded:
                shadow.end(token)
                status = _GRPC_AS_HTTP.get(code, 500)
                self._recorder.submit(rid, route, status, time.perf_counter() - started, captured)

    async def handle_exception(self, ex, request_or_iterator, context, method_name):
        if isinstance(ex, PredictorError):
            if ex.http_status >= 500:
                log.warning("grpc %s failed: %s", method_name, ex.message)
            await context.abort(ex.grpc_status, ex.message)
        await super().handle_exception(ex, request_or_iterator, context, method_name)


class _RequestMetrics:
    """Pure ASGI middleware: count every HTTP response by route template and status code."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def capture(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            metrics.REQUESTS.labels(route, str(status)).inc()
            if status >= 400:
                metrics.ERRORS.labels(route, str(status)).inc()


class _DataPlane(DataPlane):
    """Server readiness is the models' readiness.

    KServe answers /v2/health/ready (and gRPC ServerReady) `true` as soon as a custom predictor's
    process runs, before any model is warm; a probe on it would send traffic to a cold pod.
    """

    async def ready(self) -> bool:
        names = list(self.model_registry.get_models())
        return bool(names) and all([await self.model_registry.is_model_ready(n) for n in names])


# --- servers ---------------------------------------------------------------------------------
class _Uvicorn(uvicorn.Server):
    """Uvicorn without its own signal handlers: the drain below owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class _RESTServer(RESTServer):
    def __init__(
        self, service: TTSService, settings: Settings, recorder: shadow.Recorder | None, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self._service = service
        self._settings = settings
        self._recorder = recorder
        self._server = _Uvicorn(self.config)

    def stop(self) -> None:
        self._server.should_exit = True

    def _add_middlewares(self, app: FastAPI) -> None:
        # KServe's TimingMiddleware logs every request at INFO; our counters and spans replace it.
        app.add_middleware(_RequestMetrics)
        # Added last, so outermost: its latency covers everything the app does for the request.
        app.add_middleware(
            shadow.RequestIdentity,
            revision=self._settings.revision_name,
            recorder=self._recorder,
            routes=SYNTHESIS_ROUTES,
        )

    def _register_endpoints(self, app: FastAPI) -> None:
        # Registered before KServe's routes, so these win where paths coincide.
        add_routes(app, self._service, self._settings)
        super()._register_endpoints(app)

    def _add_exception_handlers(self, app: FastAPI) -> None:
        super()._add_exception_handlers(app)
        app.add_exception_handler(PredictorError, _http_error)
        # KServe logs a traceback for every not-ready answer: one per probe during each cold start.
        app.add_exception_handler(ModelNotReady, _not_ready)
        app.add_exception_handler(ServerNotReady, _not_ready)


class _GRPCServer:
    def __init__(
        self, port: int, dataplane: DataPlane, extension: ModelRepositoryExtension, interceptor: _GrpcErrors
    ):
        self._port = port
        self._server = aio.server(
            interceptors=(interceptor,),
            options=[
                ("grpc.max_send_message_length", 256 << 20),
                ("grpc.max_receive_message_length", 64 << 20),
            ],
        )
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(dataplane, extension), self._server
        )
        self._server.add_insecure_port(f"[::]:{port}")

    async def start(self) -> None:
        await self._server.start()
        log.info("gRPC listening", extra={"port": self._port})
        await self._server.wait_for_termination()

    async def stop(self, grace_s: float) -> None:
        await self._server.stop(grace=grace_s)


def add_routes(app: FastAPI, service: TTSService, settings: Settings) -> None:
    name = settings.model_name
    outputs = OutputStore(settings)
    app.include_router(speech.router(service, settings))

    @app.post("/v2/models/{model_name}/infer")
    async def v2_infer(model_name: str, request: Request) -> Response:
        # KServe's route reads a body without content-type: application/json as binary and then
        # demands the binary header; Triton's HTTP client sends JSON exactly like that.
        _known(model_name, name)
        service.require_ready()
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        binary_in = BINARY_HEADER in headers
        if binary_in:
            infer_request = decode_binary_request(body, headers[BINARY_HEADER], name)
        else:
            infer_request = InferRequest.from_inference_request(parse_inference_request(body), name)
        call = decode_v2(infer_request, binary_default=binary_in or bool(infer_request.use_binary_outputs))
        result = await service.synthesize(call.texts, call.params)
        content, response_headers = encode_rest(call, result, name)
        return Response(content, headers=response_headers)

    @app.get("/v2/models/{model_name}")
    async def model_metadata(model_name: str) -> dict:
        _known(model_name, name)
        meta = {
            "name": name,
            "versions": [],
            "platform": settings.engine,
            "inputs": INPUT_METADATA,
            "outputs": OUTPUT_METADATA,
        }
        if service.engine is not None:
            meta["parameters"] = {"sample_rate": service.sample_rate, "voices": service.voices}
        return meta

    @app.post("/v1/models/{model_name}:predict")
    async def v1_predict(model_name: str, request: Request) -> Response:
        _known(model_name, name)
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        if events.is_cloudevent(headers):
            event = events.parse(headers, body, settings)
            completion = await events.complete(event, service, outputs, settings)
            reply_headers, reply_body = events.reply(event, completion, settings)
            return Response(content=reply_body, headers=reply_headers)
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"body is not valid JSON: {exc}") from None
        texts, params = parse_v1(payload)
        result = await service.synthesize(texts, params)
        return Response(orjson.dumps({"predictions": v1_predictions(result)}), media_type="application/json")


def _known(model_name: str, name: str) -> None:
    if model_name != name:
        raise ModelNotFound(model_name)


# --- cold start ------------------------------------------------------------------------------
def process_age_s() -> float:
    """Seconds since this process was exec'd (from /proc), so cold start includes interpreter start."""
    import os

    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def _span(name: str, start_ns: int, end_ns: int, **attrs: Any) -> None:
    span = tracing.tracer().start_span(name, start_time=start_ns, attributes=attrs)
    span.end(end_time=end_ns)


async def await_cold_start(service: TTSService, settings: Settings, pending: Future) -> None:
    """Wait for the cold-start pipeline, then record it (metrics, spans, one log line) and go ready.

    A ConfigError (an engine that cannot exist here, such as DEVICE=cuda without a GPU) propagates
    and the process exits at start; fetch or load failures leave the model not ready, saying why.
    """
    exec_ns = time.time_ns() - int(process_age_s() * 1e9)
    root = tracing.tracer().start_span("cold_start", start_time=exec_ns)
    try:
        done: ColdStart = await asyncio.wrap_future(pending)
    except ConfigError:
        root.end()
        raise
    except Exception as exc:
        root.record_exception(exc)
        root.end()
        log.error(
            "cold start failed; the model stays not ready: %s",
            exc,
            exc_info=not isinstance(exc, PredictorError),
        )
        return
    with trace.use_span(root, end_on_exit=True):
        for phase, (t0, t1) in done.phases_ns.items():
            _span(phase, t0, t1)
            metrics.COLD_START_SECONDS.labels(phase).set((t1 - t0) / 1e9)
        service.mark_ready(done.engine)
        total = process_age_s()
        metrics.COLD_START_SECONDS.labels("total").set(total)
    log.info(
        "model ready",
        extra={
            "model": settings.model_name,
            "artifact": f"{done.manifest.name}@{done.manifest.version}",
            "cold_start_s": round(total, 3),
            "phases_s": {p: round((t1 - t0) / 1e9, 3) for p, (t0, t1) in done.phases_ns.items()},
            "bytes_fetched": done.report.bytes_downloaded,
            "files_skipped": done.report.files_skipped,
        },
    )


# --- main ------------------------------------------------------------------------------------
def _recorder(settings: Settings) -> shadow.Recorder | None:
    try:
        sink = shadow.open_sink(settings.shadow_sink, settings.revision_name)
    except (StorageError, OSError) as exc:  # OSError: a local directory that cannot be created
        raise ConfigError(f"invalid configuration: SHADOW_SINK: {exc}") from None
    if sink is None:
        return None
    log.info("shadow records on", extra={"sink": settings.shadow_sink, "revision": settings.revision_name})
    return shadow.Recorder(
        sink,
        settings.revision_name,
        batch_records=settings.shadow_batch_records,
        flush_s=settings.shadow_flush_s,
        queue_size=settings.shadow_queue,
    )


async def run(settings: Settings, cold_start: Future) -> None:
    recorder = _recorder(settings)
    service = TTSService(settings)
    model = TTSModel(settings.model_name, service)
    registry = ModelRepository()
    registry.update(model)
    dataplane = _DataPlane(model_registry=registry)
    extension = ModelRepositoryExtension(model_registry=registry)
    rest = _RESTServer(
        service,
        settings,
        recorder,
        app="kserve.model_server:app",
        data_plane=dataplane,
        model_repository_extension=extension,
        http_port=settings.http_port,
        grace_period=int(settings.drain_timeout_s) + 1,
    )
    servers = [asyncio.create_task(rest.start(), name="rest")]
    grpc_server = None
    if settings.grpc_port:
        grpc_server = _GRPCServer(
            settings.grpc_port, dataplane, extension, _GrpcErrors(settings.revision_name, recorder)
        )
        servers.append(asyncio.create_task(grpc_server.start(), name="grpc"))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    warm = asyncio.create_task(await_cold_start(service, settings, cold_start), name="cold-start")

    stopping = asyncio.create_task(stop.wait())
    pending = {stopping, warm, *servers}
    while stopping in pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopping and task.exception():
                for other in pending:
                    other.cancel()
                raise task.exception()
    log.info("draining", extra={"timeout_s": settings.drain_timeout_s})
    finished = await service.drain(settings.drain_timeout_s)
    warm.cancel()
    rest.stop()
    if grpc_server:
        await grpc_server.stop(grace_s=1.0)
    await asyncio.gather(*servers, return_exceptions=True)
    if recorder is not None:
        # After both servers stopped: every finished request has queued its record by now.
        await asyncio.to_thread(recorder.close)
    tracing.shutdown()
    log.info("stopped", extra={"drained": finished})
    if not finished:
        raise NotReady("in-flight requests were cut off by DRAIN_TIMEOUT_S")
