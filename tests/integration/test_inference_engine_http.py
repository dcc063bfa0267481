"""A real engine behind a real HTTP /metrics page, and the CONCUR controller scraping it:
vLLM's names, the SGLang adapter, a dead endpoint holding the window, the admit/release
endpoint an outside agent framework calls."""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rota.bench.fitted_clock import FittedClock
from rota.jobkit.inference.admission import ScrapedAdmission, admission_routes
from rota.jobkit.inference.agents import Workload, run_workload
from rota.jobkit.inference.engine import Engine, EngineConfig
from rota.jobkit.inference.kv_window import AdmissionController, ControllerConfig, Decision
from rota.jobkit.inference.metrics_http import MetricsServer
from rota.jobkit.inference.model import ModelConfig
from rota.jobkit.inference.scrape import parse_text, scrape

SMALL = ModelConfig(d_model=64, heads=4, kv_heads=2, ffn=128, layers=1, seed=3)


pytestmark = pytest.mark.usefixtures("torch_one_thread")  # tests/conftest.py


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def post(url: str) -> dict[str, object]:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        out: dict[str, object] = json.loads(r.read().decode())
        return out


def test_metrics_page_has_vllms_names_and_the_engines_counts() -> None:
    engine = Engine(EngineConfig(cache_blocks=64, model=SMALL))
    server = MetricsServer(engine.snapshot)
    try:
        rng = random.Random(0)
        prompt = [rng.randrange(256) for _ in range(40)]
        for turn in range(2):  # the second request's first two blocks are prefix hits
            engine.add_request(f"r{turn}", prompt, 4)
            while engine.has_work():
                engine.step()
        text = get(server.url)
        for name in ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                     "vllm:num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:generation_tokens_total", "rota:recomputed_prefill_tokens_total"):
            assert f"# TYPE {name} " in text and f'{name}{{model_name="rota-tiny"}} ' in text
        m = parse_text(text)
        assert m["vllm:prefix_cache_queries_total"] == 80 and m["vllm:prefix_cache_hits_total"] == 32
        assert m["vllm:generation_tokens_total"] == 8 and m["vllm:kv_cache_usage_perc"] == 0.0
        sample = scrape(server.url)
        assert sample is not None and sample.prefix_hits == 32 and sample.recomputed_tokens == 0
    finally:
        server.stop()


def test_controller_scrapes_the_engine_over_http_and_holds_when_it_stops() -> None:
    w = Workload(name="http", agents=10, turns=(3, 5), gen_tokens=8, obs_tokens=40, tool_latency_s=(0.0, 0.02),
                 cache_blocks=40, seed=4, control_interval_s=0.01, prompt_tokens=32, shared_prefix_tokens=16)
    engine = Engine(EngineConfig(cache_blocks=w.cache_blocks, model=SMALL))
    server = MetricsServer(engine.snapshot)
    ctl = AdmissionController(ControllerConfig(w_init=2, w_max=w.agents, cooldown_s=0.05))
    actions: list[str] = []
    stop_after = 5

    window_at_stop = [0, 0]  # the window and the active agents when the endpoint died

    def on_interval(decision: Decision, _engine: Engine, _now: float) -> None:
        actions.append(decision.action)
        if len(actions) == stop_after:
            server.stop()  # the endpoint dies mid-run: the window must stay where it is
        if len(actions) > stop_after:
            assert decision.action == "no_signal" and decision.window == window_at_stop[0]
            assert len(ctl.active) <= max(decision.window, window_at_stop[1])  # never admits without limit
        else:
            window_at_stop[:] = [decision.window, len(ctl.active)]

    clock = FittedClock((1e-3, 2e-5, 0.0, 0.0))  # a fixed price per step: the same run every time
    result = run_workload(w, ctl, engine=engine, sample=lambda _e: scrape(server.url, timeout_s=0.5),
                          on_interval=on_interval, clock=clock)
    assert result.generated == engine.counters.generated > 0  # every agent still finished
    assert len(actions) > stop_after + 1, "the run outlived the endpoint for a few intervals"
    assert set(actions[:stop_after]) - {"no_signal"}, "while it answered the controller acted on real samples"
    assert "increase" in actions[:stop_after]
    assert all(a == "no_signal" for a in actions[stop_after:])
    last = ctl.observe(None, 99.0)
    assert "not answering" in last.reason


class _SGLangPage(BaseHTTPRequestHandler):
    TEXT = ('# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name="q"} 0.93\n'
            '# TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate{model_name="q"} 0.41\n')

    def do_GET(self) -> None:  # noqa: N802
        data = self.TEXT.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return


def test_sglang_adapter_reads_token_usage_and_cache_hit_rate() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _SGLangPage)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        sample = scrape(f"http://127.0.0.1:{httpd.server_address[1]}/metrics")
        assert sample is not None and sample.usage == pytest.approx(0.93) and sample.hit_rate == pytest.approx(0.41)
        assert sample.prefix_queries is None
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_admit_release_endpoint_for_an_outside_agent_framework() -> None:
    engine = Engine(EngineConfig(cache_blocks=16, model=SMALL))
    ctl = AdmissionController(ControllerConfig(w_init=2, slow_start=False))
    server = MetricsServer(engine.snapshot)
    admission = ScrapedAdmission(ctl, server.url)
    server.add_routes(admission_routes(admission))
    base = server.url.removesuffix("/metrics")
    try:
        assert [post(f"{base}/admit?agent={a}")["admitted"] for a in ("x", "y", "z")] == [True, True, False]
        assert post(f"{base}/admit?agent=z")["admitted"] is False  # still held, in its place
        released = post(f"{base}/release?agent=x")
        assert released["admitted"] == ["z"] and released["active"] == 2
        assert post(f"{base}/admit?agent=z")["admitted"] is True
        admission.tick(1.0)
        status = json.loads(get(f"{base}/window"))
        assert status["window"] == 2 and status["last"]["action"] == "hold"  # nothing held: not binding
        with pytest.raises(urllib.error.HTTPError):
            post(f"{base}/admit")
    finally:
        server.stop()
    assert scrape(server.url, timeout_s=0.5) is None  # a stopped server: no sample


def test_admit_takes_the_agent_s_tokens_and_refuses_a_bad_count_naming_it() -> None:
    engine = Engine(EngineConfig(cache_blocks=8, model=SMALL))  # 8 blocks of 16 tokens
    ctl = AdmissionController(ControllerConfig(w_init=4, w_max=4, slow_start=False))
    server = MetricsServer(engine.snapshot)
    admission = ScrapedAdmission(ctl, server.url)
    server.add_routes(admission_routes(admission))
    base = server.url.removesuffix("/metrics")
    try:
        admission.tick(0.0)  # the first scrape: the engine's page says its cache's size
        for bad in ("abc", "0", "-3", "1.5", "", "%C2%B2"):  # "²" is a digit to str.isdigit, not to int()
            with pytest.raises(urllib.error.HTTPError) as refused:
                post(f"{base}/admit?agent=x&tokens={bad}")
            assert refused.value.code == 400 and "tokens" in json.loads(refused.value.read())["error"]
        assert ctl.active == () and ctl.held == ()  # a refused call changes nothing
        # 80 tokens are 5 blocks: a second agent's 5 do not fit beside the first's in 8
        assert [post(f"{base}/admit?agent={a}&tokens=80")["admitted"] for a in ("x", "y")] == [True, False]
        assert post(f"{base}/admit?agent=z")["admitted"] is False  # without tokens: behind y, in order
        assert post(f"{base}/release?agent=x")["admitted"] == ["y", "z"]
    finally:
        server.stop()


def test_the_sdk_admits_and_releases_an_outside_agent_over_the_job_s_endpoint() -> None:
    from datetime import timedelta

    from rota.client import AdmissionEndpoint, FailedPreconditionError, InvalidArgumentError
    from rota.client.kv_window import endpoint_of

    engine = Engine(EngineConfig(cache_blocks=64, model=SMALL))
    server = MetricsServer(engine.snapshot)
    controller = AdmissionController(ControllerConfig(w_max=2, w_init=1))
    server.add_routes(admission_routes(ScrapedAdmission(controller, server.url)))
    try:
        gate = endpoint_of("j-1", {"admission_url": server.url.removesuffix("/metrics")}, timedelta(seconds=5))
        assert isinstance(gate, AdmissionEndpoint)
        assert gate.admit("outside-1") is True  # the window (1) has room
        assert gate.admit("outside-2") is False  # held, in order
        assert gate.window()["held"] == 1
        assert gate.release("outside-1") == ["outside-2"]  # the freed slot goes to the next held
        with pytest.raises(InvalidArgumentError):
            gate.admit("")
        assert gate.admit("outside-2", tokens=100) is True  # active: its length is recorded
        assert controller.state()["tokens"] == {"outside-2": 100}
        for bad in (0, -1, 2.5, True, "7"):
            with pytest.raises(InvalidArgumentError) as refused:
                gate.admit("outside-3", tokens=bad)  # type: ignore[arg-type]
            assert refused.value.field == "tokens"
        assert gate.window()["held"] == 0 and gate.window()["active"] == 1  # refused before any call
    finally:
        server.stop()
    with pytest.raises(FailedPreconditionError):
        endpoint_of("j-2", {"step": 3}, timedelta(seconds=1))
