"""OpenTelemetry tracing; the exporter is chosen by config: none, console or otlp."""

from __future__ import annotations

import logging
import sys

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_provider: TracerProvider | None = None


def setup_tracing(service_name: str, exporter: str, otlp_endpoint: str = "") -> trace.Tracer:
    global _provider
    if exporter not in ("none", "console", "otlp"):
        raise ValueError(f"ROTA_TRACING: unknown exporter {exporter!r} (none, console or otlp)")
    if exporter != "none" and _provider is None:
        provider = TracerProvider(resource=Resource.create({"service.name": f"rota-{service_name}"}))
        if exporter == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
        trace.set_tracer_provider(provider)
        _provider = provider
    return trace.get_tracer(f"rota.{service_name}")


def shutdown_tracing() -> None:
    if _provider is not None:
        _provider.shutdown()


def setup_logging(service_name: str) -> None:
    """Structured-enough logs: one line per record with the service name."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {service_name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
