"""OpenTelemetry tracing, the exporter chosen by config (none, console or otlp), and the
services' logging (text lines or JSON objects)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

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


LOG_FORMATS = ("text", "json")

# The job a piece of work is about (an agent's launch or stop of it, say): every record logged
# inside `job_logging(job_id)` carries it, as does one logged with `extra={"job_id": ...}`.
current_job_id: ContextVar[str] = ContextVar("rota_job_id", default="")

# A LogRecord's own attributes; any other one came from `extra=` and goes into the JSON.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


@contextmanager
def job_logging(job_id: str) -> Iterator[None]:
    token = current_job_id.set(job_id)
    try:
        yield
    finally:
        current_job_id.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, `Z`), level, service, logger, message; trace_id
    (the current OpenTelemetry span's) and job_id when known; exc with a traceback; and
    whatever `extra=` added. A log shipper reads it without a pattern of its own."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        out: dict[str, Any] = {
            "ts": ts, "level": record.levelname, "service": self.service, "logger": record.name,
            "message": record.getMessage(),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            out["trace_id"] = format(span.trace_id, "032x")
        job_id = getattr(record, "job_id", "") or current_job_id.get()
        if job_id:
            out["job_id"] = str(job_id)
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def setup_logging(service_name: str, log_format: str = "text") -> None:
    """Logs on stderr: a line per record with the service name (`text`), or a JSON object
    per line (`json`, ROTA_LOG_FORMAT)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"ROTA_LOG_FORMAT: one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(service_name))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service_name} %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
