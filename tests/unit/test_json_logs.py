"""ROTA_LOG_FORMAT: the services' and agents' records as one JSON object per line, with the
trace and job they belong to; the text lines unchanged by default."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from rota.common.config import Settings
from rota.common.telemetry import JsonFormatter, job_logging, setup_logging


@pytest.fixture
def configure(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., io.StringIO]]:
    """setup_logging(...) on a root logger without handlers (basicConfig configures only
    such a one; pytest's own are put back after), writing to the StringIO it returns."""
    logger = logging.getLogger()
    saved, level = logger.handlers[:], logger.level

    def configure(*args: str) -> io.StringIO:
        stream = io.StringIO()
        monkeypatch.setattr("sys.stderr", stream)
        logger.handlers = []
        setup_logging(*args)
        return stream

    yield configure
    logger.handlers, logger.level = saved, level


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_fields_and_the_job_from_extra_or_the_context(
    configure: Callable[..., io.StringIO],
) -> None:
    stream = configure("agent[node-1]", "json")
    log = logging.getLogger("rota.agent")
    log.info("registered %s", "node-1")
    log.warning("stop of %s failed", "j-1", extra={"job_id": "j-1", "node": "node-2"})
    with job_logging("j-2"):
        log.info("launched")
    log.info("after")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("cycle failed")
    first, extra, ctx, after, failed = records(stream)
    assert set(first) == {"ts", "level", "service", "logger", "message"}
    assert (first["level"], first["service"], first["logger"], first["message"]) == (
        "INFO", "agent[node-1]", "rota.agent", "registered node-1")
    assert str(first["ts"]).endswith("Z") and "T" in str(first["ts"])
    assert (extra["job_id"], extra["node"], extra["level"]) == ("j-1", "node-2", "WARNING")
    assert ctx["job_id"] == "j-2" and "job_id" not in after  # the context ends with the block
    assert "RuntimeError: boom" in str(failed["exc"]) and failed["level"] == "ERROR"


def test_the_trace_id_is_the_current_spans() -> None:
    tracer = TracerProvider().get_tracer("test")
    formatter = JsonFormatter("api")
    record = logging.LogRecord("rota.api", logging.INFO, __file__, 1, "in a span", None, None)
    assert "trace_id" not in json.loads(formatter.format(record))
    with tracer.start_as_current_span("rpc") as span:
        got = json.loads(formatter.format(record))
    assert got["trace_id"] == format(span.get_span_context().trace_id, "032x") and len(got["trace_id"]) == 32
    assert trace.get_current_span().get_span_context().is_valid is False


def test_text_is_the_default_and_a_bad_format_names_the_variable(
    configure: Callable[..., io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = configure("api")
    logging.getLogger("rota.api").info("hello")
    line = stream.getvalue().strip()
    assert line.endswith(" api INFO rota.api: hello") and not line.startswith("{")
    monkeypatch.delenv("ROTA_LOG_FORMAT", raising=False)
    assert Settings.from_env().log_format == "text"
    monkeypatch.setenv("ROTA_LOG_FORMAT", "json")
    assert Settings.from_env().log_format == "json"
    monkeypatch.setenv("ROTA_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="ROTA_LOG_FORMAT"):
        Settings.from_env()
    with pytest.raises(ValueError, match="ROTA_LOG_FORMAT"):
        setup_logging("api", "xml")
