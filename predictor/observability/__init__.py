"""Observability: Prometheus metrics, OpenTelemetry tracing, JSON logs, request ids."""
