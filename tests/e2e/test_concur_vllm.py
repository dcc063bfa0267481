"""Opt-in: the CONCUR controller against a real vLLM server on the CPU.

Skipped unless vLLM imports in the virtual environment at ``$ROTA_VLLM_VENV`` (default
``~/.cache/rota/vllm-venv``; ``rota bench concur --engine vllm --install-vllm`` makes it) and
``ROTA_E2E_VLLM=1`` is set: the server takes minutes to start on two shared cores.

A small model with random weights, prompts as token ids, prefix caching on and a KV cache
of 48 blocks; eight agents of three turns each, real HTTP clients whose tool calls really
sleep. The controller scrapes vLLM's own ``/metrics`` and gates them at step boundaries.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rota.bench.concur_live import LiveServer, run_live
from rota.bench.vllm_server import BLOCK_TOKENS, TINY_LLAMA, VllmServer, venv_path, vllm_python, write_model
from rota.jobkit.inference.admission import ScrapedAdmission
from rota.jobkit.inference.agents import Workload
from rota.jobkit.inference.kv_window import AdmissionController, ControllerConfig
from rota.jobkit.inference.scrape import cache_size, parse_text, sample_from

WORKLOAD = Workload(name="e2e", agents=8, turns=(3, 3), gen_tokens=8, obs_tokens=48, tool_latency_s=(0.05, 0.2),
                    cache_blocks=48, seed=7, control_interval_s=0.2)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    if os.environ.get("ROTA_E2E_VLLM") != "1":
        pytest.skip("set ROTA_E2E_VLLM=1 to run the controller against a real vLLM server")
    python = vllm_python(venv_path())
    if isinstance(python, str):
        pytest.skip(python)
    folder: Path = tmp_path_factory.mktemp("vllm")
    srv = VllmServer(python, write_model(folder / "model"), cache_blocks=WORKLOAD.cache_blocks, max_num_seqs=8,
                     log_path=folder / "vllm.log")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_vllm_metrics_carry_the_controllers_signals(server: VllmServer) -> None:
    live = LiveServer(server.base_url, block_tokens=BLOCK_TOKENS)
    prompt = list(range(5, 5 + 3 * BLOCK_TOKENS))
    first = live.complete(prompt, 4)
    assert len(first) == 4 and all(0 <= t < int(str(TINY_LLAMA["vocab_size"])) for t in first)
    live.complete(prompt + first, 4)  # the first prompt's blocks are prefix hits now
    m = parse_text(live.metrics_text())
    for name in ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert name in m, name
    sample = sample_from(m)
    assert sample is not None and sample.prefix_hits is not None and sample.prefix_hits >= 2 * BLOCK_TOKENS
    assert sample.recomputed_tokens is None  # vLLM counts none: the controller reads the hit rate's fall
    assert sample.running is not None and sample.waiting is not None  # the fit and the queue at a full cache
    assert cache_size(live.metrics_text()) == (server.vllm_blocks, BLOCK_TOKENS)  # what admission fits within


def test_controller_drives_real_vllm_agents_to_completion(server: VllmServer) -> None:
    server.reset_prefix_cache()
    controller = AdmissionController(ControllerConfig(w_min=1, w_max=WORKLOAD.agents, w_init=4))
    admission = ScrapedAdmission(controller, f"{server.base_url}/metrics")
    live = LiveServer(server.base_url, block_tokens=BLOCK_TOKENS)
    result = run_live(WORKLOAD, admission, live, controlled=True, vocab=int(str(TINY_LLAMA["vocab_size"])))
    assert result.generated == WORKLOAD.agents * 3 * WORKLOAD.gen_tokens
    assert result.decisions, "the controller observed no interval"
    assert all(1 <= d["window"] <= WORKLOAD.agents for d in result.decisions)
    assert any(d["action"] != "no_signal" for d in result.decisions)  # it read vLLM's page
    assert 0.0 < result.hit_rate <= 1.0
    assert result.makespan_s >= 2 * 0.05  # two real tool calls per agent, at least
    assert not controller.active and not controller.held  # every agent released its slot
    assert controller.state()["cache"] == [server.vllm_blocks, BLOCK_TOKENS]  # read before the first agent asked
