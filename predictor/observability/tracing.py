"""OpenTelemetry spans for cold-start phases and requests.

Exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set; otherwise the global no-op tracer
is used and spans cost next to nothing. Span attributes never carry credentials or request text.
"""

from __future__ import annotations

from opentelemetry import trace

_TRACER_NAME = "tts-predictor"


def configure(endpoint: str, service_name: str) -> None:
    if not endpoint:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    # The SDK's default path for traces; the collector listens there on its HTTP receiver.
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces"), schedule_delay_millis=500
        )
    )
    trace.set_tracer_provider(provider)


def tracer() -> trace.Tracer:
    return trace.get_tracer(_TRACER_NAME)


def shutdown() -> None:
    """Flush pending spans (on exit, so the cold-start trace of a short-lived pod is not lost)."""
    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()
