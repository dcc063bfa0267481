"""The engine's Prometheus text on ``/metrics``, under vLLM's metric names.

``render`` writes the exposition text of a counters snapshot; ``MetricsServer`` serves it
from a thread (stdlib ``http.server``), reading the snapshot the engine publishes after
each step, so a scrape never sees a step half done. Names: vLLM's
(``vllm:kv_cache_usage_perc`` is a fraction in [0, 1], as in vLLM V1), and ours under
``rota:`` for what vLLM does not export (recomputed prefill tokens, evicted blocks).
The cache's size is vLLM's info gauge ``vllm:cache_config_info`` with its ``num_gpu_blocks``
and ``block_size`` labels. ``stop`` closes the socket: a scraper then gets connection refused, as from a dead server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rota.jobkit.inference.engine import EngineCounters

__all__ = ["MetricsServer", "render"]

MODEL_NAME = "rota-tiny"

_METRICS: tuple[tuple[str, str, str, str], ...] = (
    # (name, type, counters field, help)
    ("vllm:kv_cache_usage_perc", "gauge", "usage", "KV-cache usage. 1 means 100 percent usage."),
    ("vllm:num_requests_running", "gauge", "running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "gauge", "waiting", "Number of requests waiting to be processed."),
    ("vllm:prefix_cache_queries", "counter", "prefix_queries", "Prefix cache queries, in queried tokens."),
    ("vllm:prefix_cache_hits", "counter", "prefix_hits", "Prefix cache hits, in cached tokens."),
    ("vllm:num_preemptions", "counter", "preemptions", "Cumulative number of preemptions."),
    ("vllm:generation_tokens", "counter", "generated", "Number of generation tokens processed."),
    ("vllm:prompt_tokens", "counter", "prefilled", "Number of prefill tokens processed."),
    ("rota:recomputed_prefill_tokens", "counter", "recomputed",
     "Prefill tokens computed again because their blocks had been evicted."),
    ("rota:kv_block_evictions", "counter", "evictions", "Cached KV blocks evicted to make room."),
)


def render(c: EngineCounters) -> str:
    lines: list[str] = []
    for name, kind, attr, text in _METRICS:
        exported = f"{name}_total" if kind == "counter" else name
        lines += [f"# HELP {exported} {text}", f"# TYPE {exported} {kind}",
                  f'{exported}{{model_name="{MODEL_NAME}"}} {float(getattr(c, attr))!r}']
    if c.cache_blocks > 0:
        lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                  "# TYPE vllm:cache_config_info gauge",
                  f'vllm:cache_config_info{{block_size="{c.block_tokens}",num_gpu_blocks="{c.cache_blocks}"}} 1.0']
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves ``/metrics`` (and any extra GET/POST routes) on 127.0.0.1 from a thread."""

    def __init__(self, snapshot: Callable[[], EngineCounters], port: int = 0,
                 routes: dict[str, Callable[[str, str], tuple[int, str]]] | None = None) -> None:
        self._snapshot = snapshot
        self._routes = routes or {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._answer("POST")

            def _answer(self, method: str) -> None:
                path, _, query = self.path.partition("?")
                if method == "GET" and path == "/metrics":
                    code, body, ctype = 200, render(server._snapshot()), "text/plain; version=0.0.4"
                elif path in server._routes:
                    code, body = server._routes[path](method, query)
                    ctype = "application/json"
                else:
                    code, body, ctype = 404, "not found\n", "text/plain"
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
                return

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    def add_routes(self, routes: dict[str, Callable[[str, str], tuple[int, str]]]) -> None:
        """More routes (e.g. ``admission_routes``), once what they serve knows this URL."""
        self._routes.update(routes)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
