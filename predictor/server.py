"""The predictor process: KServe's REST and gRPC servers around our model, cold start, drain.

Cold start, in the order it overlaps (the CLI starts the first two before importing this module):

    thread 1: fetch the artifact into MODEL_DIR          ─┐
    thread 2: construct the engine (imports, phonemizer)  ├─> load -> warm-up -> ready
    main:     import KServe, bind ports, answer liveness ─┘

Readiness is the model's: /v2/models/{name}/ready, /v1/models/{name} and also /v2/health/ready (which
KServe answers `true` as soon as the process runs, before any model is warm; we answer it from the
model) stay 503 until the warm-up synthesis has run. Liveness (/v2/health/live) is 200 throughout.

SIGTERM: readiness drops to 503 and new requests are refused (503 / UNAVAILABLE), requests admitted
before it run to their end (every segment of a stream, an event's upload and record, a gRPC call) up to
DRAIN_TIMEOUT_S, then both servers stop and the process exits 0 (the log names any request cut off).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import FastAPIDeprecationWarning, RequestValidationError
from grpc import aio
from kserve.errors import ModelNotReady, ServerNotReady
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.server import RESTServer
from opentelemetry import trace
from starlette.exceptions import HTTPException as StarletteHTTPException

from predictor.api import openapi, pages, speech, v1, v2
from predictor.api.checks import require_version
from predictor.api.handlers import (
    http_exception_response,
    not_ready_response,
    predictor_error_response,
    validation_error_response,
)
from predictor.api.kserve_model import TTSModel
from predictor.api.stream_infer import StreamInferHandler
from predictor.config import ConfigError, Settings
from predictor.errors import PredictorError
from predictor.events.outputs import OutputStore
from predictor.observability import metrics, tracing
from predictor.serving import coldstart
from predictor.serving.coldstart import ColdStart, process_age_s
from predictor.serving.connections import guarded_protocol, raise_open_files_limit
from predictor.serving.interceptor import GrpcInterceptor
from predictor.serving.middleware import Limits, RequestMiddleware
from predictor.serving.service import TTSService
from predictor.shadow import recorder as records

log = logging.getLogger("predictor.server")

# KServe's FastAPI app declares ORJSONResponse as its default response class, which FastAPI now
# deprecates; the warning would land in every pod's log on its first request and says nothing to users.
warnings.filterwarnings("ignore", category=FastAPIDeprecationWarning)


# Routes whose requests leave a shadow record (REST route templates, gRPC methods).
SYNTHESIS_ROUTES = frozenset(
    {"/v2/models/{model_name}/infer", "/v1/models/{model_name}:predict", "/v1/audio/speech"}
)


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
    def capture_signals(self) -> Iterator[None]:
        yield


class _RESTServer(RESTServer):
    def __init__(
        self, service: TTSService, settings: Settings, recorder: records.Recorder | None, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self._service = service
        self._settings = settings
        self._recorder = recorder
        # h11, not httptools: h11 bounds the request head (MAX_HEADER_BYTES; beyond it 400), httptools
        # does not. Its cost is parsing only, microseconds against a synthesis' hundreds of milliseconds.
        # The protocol also times out request heads and keeps the probes out of MAX_CONNECTIONS'
        # refusals (serving/connections.py).
        self.config.http = guarded_protocol(settings.head_timeout_s, probe_paths(settings))
        self.config.h11_max_incomplete_event_size = settings.max_header_bytes
        self.config.limit_concurrency = settings.max_connections
        self.config.timeout_keep_alive = int(settings.keepalive_timeout_s)
        self._server = _Uvicorn(self.config)

    def stop(self, grace_s: float) -> None:
        # The drain has already waited for admitted requests; what is left (a request the timeout cut
        # off, an open probe) gets grace_s, not uvicorn's full grace period a second time.
        self._server.config.timeout_graceful_shutdown = max(1, round(grace_s))
        self._server.should_exit = True

    def _add_middlewares(self, app: FastAPI) -> None:
        # Replaces KServe's TimingMiddleware, which logs every request at INFO: our counters and spans
        # say more.
        app.add_middleware(
            RequestMiddleware,
            revision=self._settings.revision_name,
            recorder=self._recorder,
            routes=SYNTHESIS_ROUTES,
            limits=Limits(
                max_body_bytes=self._settings.max_request_bytes,
                max_header_bytes=self._settings.max_header_bytes,
                max_header_count=self._settings.max_header_count,
                body_timeout_s=self._settings.body_timeout_s,
            ),
            service=self._service,
            close_when_busy=self._settings.close_when_busy,
        )

    def _register_endpoints(self, app: FastAPI) -> None:
        # Registered before KServe's routes, so these win where paths coincide.
        add_routes(app, self._service, self._settings)
        super()._register_endpoints(app)
        # `GET /v2/` answers as `/v2` (server metadata) instead of Starlette's redirect to it.
        dataplane = self.dataplane

        async def server_metadata() -> dict[str, Any]:
            return dict(dataplane.metadata())

        app.add_api_route("/v2/", server_metadata, methods=["GET"], include_in_schema=False)

    def _add_exception_handlers(self, app: FastAPI) -> None:
        super()._add_exception_handlers(app)
        app.add_exception_handler(PredictorError, predictor_error_response)
        # KServe logs a traceback for every not-ready answer: one per probe during each cold start.
        app.add_exception_handler(ModelNotReady, not_ready_response)
        app.add_exception_handler(ServerNotReady, not_ready_response)
        # FastAPI answers unknown routes, wrong methods and its own validation with {"detail"}; the
        # protocol's error body is {"error"}, everywhere.
        app.add_exception_handler(StarletteHTTPException, http_exception_response)
        app.add_exception_handler(RequestValidationError, validation_error_response)


class _Servicer(InferenceServicer):
    """KServe's servicer, with version fields checked as the REST routes check them: empty or the served
    version answers, another is NOT_FOUND (KServe ignores them)."""

    def __init__(self, dataplane: DataPlane, extension: ModelRepositoryExtension, version: str):
        super().__init__(dataplane, extension)
        self._version = version

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        require_version(request.model_version, self._version)
        return await super().ModelInfer(request, context)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        require_version(request.version, self._version)
        return await super().ModelReady(request, context)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        require_version(request.version, self._version)
        return await super().ModelMetadata(request, context)


class _GRPCServer:
    def __init__(
        self,
        port: int,
        dataplane: DataPlane,
        extension: ModelRepositoryExtension,
        interceptor: GrpcInterceptor,
        settings: Settings,
        stream_infer: StreamInferHandler,
    ):
        self._port = port
        self._server = aio.server(
            interceptors=(interceptor,),
            # Beyond it a call gets RESOURCE_EXHAUSTED at once, as REST's 503 beyond MAX_CONNECTIONS.
            maximum_concurrent_rpcs=settings.max_connections,
            options=[
                ("grpc.max_send_message_length", 256 << 20),
                # The same bounds as REST: a message is read in full before any handler runs, so this
                # is what one call may hold in memory; metadata is the request head.
                ("grpc.max_receive_message_length", settings.max_request_bytes),
                ("grpc.max_metadata_size", settings.max_header_bytes),
                # Idle connections are closed as REST's keep-alive ones are.
                ("grpc.max_connection_idle_ms", int(settings.keepalive_timeout_s * 1000)),
            ],
        )
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            _Servicer(dataplane, extension, settings.model_version), self._server
        )
        # Triton's ModelStreamInfer, which KServe's servicer lacks, on the same service name.
        self._server.add_generic_rpc_handlers((stream_infer,))
        self._server.add_insecure_port(f"[::]:{port}")

    async def start(self) -> None:
        await self._server.start()
        log.info("gRPC listening", extra={"port": self._port})
        await self._server.wait_for_termination()

    async def stop(self, grace_s: float) -> None:
        await self._server.stop(grace=grace_s)


def add_routes(app: FastAPI, service: TTSService, settings: Settings) -> None:
    app.include_router(openapi.router(settings))
    if settings.playground:
        # Before KServe's routes: its `/` (a liveness answer) gives way to the page.
        app.include_router(pages.router())
    app.include_router(speech.router(service, settings))
    app.include_router(v2.router(service, settings))
    app.include_router(v1.router(service, settings, OutputStore(settings)))


def _span(name: str, start_ns: int, end_ns: int, **attrs: Any) -> None:
    span = tracing.tracer().start_span(name, start_time=start_ns, attributes=attrs)
    span.end(end_time=end_ns)


# The threads making the engine's other copies after ready: joined before the process exits, since an
# exit while one is inside onnxruntime aborts the process ("terminate called without an active
# exception" on stderr, the exit status -6).
_COPIES: list[threading.Thread] = []

# When the lanes' own copy is made (Engine.add_lanes): once a request has been answered after ready
# and nothing has run for IDLE_BEFORE_LANES_S, or LANES_AT_LATEST_S after ready whatever runs. Made
# at ready, it shared the CPUs with the request a cold start woke up for: a 99-character sentence sent
# at ready took 378-601 ms against 265-316 before lanes (scratch, four starts each). Waiting for a
# quiet moment alone did not keep it away: the woken request reaches the pod some time after ready
# (the Endpoints, Knative's or the HTTP add-on's probe), and a test's request 50 ms after ready found
# the copy being made. The workers' copies are still made at ready: a pod scaled up into a burst may
# never pause, and they are its throughput.
IDLE_BEFORE_LANES_S = 0.05
LANES_AT_LATEST_S = 10.0


def _until_idle(service: TTSService, poll_s: float = 0.01) -> bool:
    """True once a request has been answered and none has been admitted or running for
    IDLE_BEFORE_LANES_S, or LANES_AT_LATEST_S from now; False if the service starts draining first (a
    copy made then would only delay the exit)."""
    quiet_since: float | None = None
    latest = time.monotonic() + LANES_AT_LATEST_S
    while True:
        now = time.monotonic()
        if service.draining:
            return False
        if now >= latest:
            return True
        if not service.answered or not service.idle():
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= IDLE_BEFORE_LANES_S:
            return True
        time.sleep(poll_s)


def _add_copies(service: TTSService, settings: Settings) -> None:
    """After ready, the engine's other copies: the workers' (Settings.solo_worker), handed to the
    service at once, and the one whose sessions let the serving copy run a call's sentences side by
    side (Engine.add_lanes): a worker's copy where there are workers, else one made for it once the
    service is idle. On an error the serving copy goes on alone."""
    engine = service.engine
    assert engine is not None
    n = settings.workers() if settings.solo_worker() else 0
    lane_threads = engine.lane_threads()
    if not n and not _until_idle(service):
        return
    start = time.time_ns()
    try:
        engines = [coldstart.copy(settings) for _ in range(n)]
        lanes = engines[0] if engines else (coldstart.copy(settings, lane_threads) if lane_threads else None)
    except Exception:  # the engine's own load errors, untyped; serving goes on as with one worker
        log.exception("could not make the engine's other copies; serving on one engine")
        return
    if engines:
        service.add_workers(engines)
        metrics.COLD_START_SECONDS.labels("more_workers").set((time.time_ns() - start) / 1e9)
    laned = lanes is not None and engine.add_lanes(lanes)
    metrics.COLD_START_SECONDS.labels("copies").set((time.time_ns() - start) / 1e9)
    log.info(
        "engine copies ready",
        extra={"workers": n, "lanes": laned, "seconds": round((time.time_ns() - start) / 1e9, 3)},
    )


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
    if settings.solo_worker() or done.engine.lane_threads():
        # Ready on the serving copy alone: a cold start does not wait for the others.
        copies = threading.Thread(
            target=_add_copies, args=(service, settings), name="engine-copies", daemon=True
        )
        _COPIES.append(copies)
        copies.start()
    log.info(
        "model ready",
        extra={
            "model": settings.model_name,
            # ENGINE=auto is resolved at start; say which engine that made, and why it could.
            "engine": f"{settings.engine_name} (ENGINE={settings.engine}, DEVICE={settings.device})",
            "artifact": f"{done.manifest.name}@{done.manifest.version}",
            "cold_start_s": round(total, 3),
            "phases_s": {p: round((t1 - t0) / 1e9, 3) for p, (t0, t1) in done.phases_ns.items()},
            "bytes_fetched": done.report.bytes_downloaded,
            "files_skipped": done.report.files_skipped,
        },
    )


def probe_paths(settings: Settings) -> frozenset[str]:
    """Paths answered from memory that the kubelet, KEDA and Prometheus poll: never refused for load."""
    name, version = settings.model_name, settings.model_version
    return frozenset(
        {
            "/v2/health/live",
            "/v2/health/ready",
            f"/v2/models/{name}/ready",
            f"/v2/models/{name}/versions/{version}/ready",
            f"/v1/models/{name}",
            "/metrics",
        }
    )


# --- main ------------------------------------------------------------------------------------
async def run(settings: Settings, cold_start: Future) -> bool:
    """Serve until SIGTERM/SIGINT and drain; True if every admitted request finished in time."""
    open_files = raise_open_files_limit()
    if open_files < settings.max_connections + 64:
        log.warning(
            "the open files limit (%d) is below MAX_CONNECTIONS=%d plus what the server needs besides",
            open_files,
            settings.max_connections,
        )
    recorder = records.from_settings(settings)
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
    if settings.grpc_listen_port is not None:
        grpc_server = _GRPCServer(
            settings.grpc_listen_port,
            dataplane,
            extension,
            GrpcInterceptor(settings.revision_name, recorder, service),
            settings,
            StreamInferHandler(service, settings.model_name, recorder),
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
            error = task.exception() if task is not stopping else None
            if error is not None:
                if grpc_server:
                    # Stopped here, on the running loop: left to the garbage collector, grpc's
                    # Server.__del__ runs after the loop closed and prints a traceback outside the log.
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await grpc_server.stop(grace_s=0)
                for other in pending:
                    other.cancel()
                raise error
    log.info("draining", extra={"timeout_s": settings.drain_timeout_s})
    coldstart.abandon()
    finished = await service.drain(settings.drain_timeout_s)
    warm.cancel()
    for copies in _COPIES:  # a copy's load and warm-up: under a second; one not yet begun is not begun
        await asyncio.to_thread(copies.join)
    rest.stop(grace_s=1.0)
    if grpc_server:
        await grpc_server.stop(grace_s=1.0)
    await asyncio.gather(*servers, return_exceptions=True)
    if recorder is not None:
        # After both servers stopped: every finished request has queued its record by now.
        await asyncio.to_thread(recorder.close)
    tracing.shutdown()
    # Exit 0 either way: DRAIN_TIMEOUT_S expiring is the configured end of a drain, not a failure; the
    # drain's warning names the requests it cut off.
    log.info("stopped", extra={"drained": finished})
    return finished
