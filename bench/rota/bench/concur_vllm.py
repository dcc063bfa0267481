"""`rota bench concur --engine vllm`: the three arms against a real vLLM server, in wall-clock time.

One server per workload (its KV cache is sized in blocks at start-up, ``cache_blocks`` of
16 tokens, as on our engine); the prefix cache is reset before each arm. Arms run one
after another on the same server: admit-all, each static cap of the sweep, the controller
(the same ``AdmissionController`` and constants as on our engine, scraping the server's
``/metrics`` over HTTP). Agents are HTTP clients (`rota.bench.concur_live`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rota.bench.concur_live import LiveServer, run_live
from rota.bench.vllm_server import BLOCK_TOKENS, TINY_LLAMA, VllmServer, ensure_vllm, venv_path, write_model
from rota.jobkit.inference.admission import ScrapedAdmission
from rota.jobkit.inference.agents import RunResult, Workload, static_gate
from rota.jobkit.inference.kv_window import AdmissionController

__all__ = ["run_vllm_arms", "vllm_or_reason"]

VOCAB = int(str(TINY_LLAMA["vocab_size"]))


def vllm_or_reason(install: bool) -> Path | str:
    return ensure_vllm(venv_path(), install)


def _arm(w: Workload, server: VllmServer, gate: AdmissionController, controlled: bool) -> RunResult:
    server.reset_prefix_cache()
    print(f"vllm: {w.name} arm starts, load average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    live = LiveServer(server.base_url, block_tokens=BLOCK_TOKENS)
    admission = ScrapedAdmission(gate, f"{server.base_url}/metrics")
    return run_live(w, admission, live, controlled=controlled, vocab=VOCAB)


def _warm_up(server: VllmServer) -> None:
    """One short request: the first one compiles kernels, which no arm should pay for."""
    LiveServer(server.base_url).complete(list(range(3, 40)), 4)


def _workload_arms(w: Workload, caps: list[int], controller: AdmissionController,
                   server: VllmServer) -> dict[str, Any]:
    started = time.perf_counter()
    sweep: dict[int, RunResult] = {}
    for cap in sorted(caps, reverse=True):
        sweep[cap] = _arm(w, server, static_gate(cap), controlled=False)
        print(f"vllm: {w.name} cap {cap}: {sweep[cap].tokens_per_s:.1f} tok/s", file=sys.stderr, flush=True)
    ctl = _arm(w, server, controller, controlled=True)
    print(f"vllm: {w.name} controller: {ctl.tokens_per_s:.1f} tok/s", file=sys.stderr, flush=True)
    return {"sweep": sweep, "controller": ctl, "wall_s": round(time.perf_counter() - started, 1)}


def run_vllm_arms(python: Path, runs: list[tuple[Workload, list[int], AdmissionController]],
                  log_dir: Path | None = None, url: str | None = None) -> list[dict[str, Any]]:
    """Every workload's arms; one server per cache size (a server takes minutes to start
    here), or, with ``url``, the server already running there (started with
    ``--num-gpu-blocks-override`` for the workloads' ``cache_blocks``, and ``VLLM_SERVER_DEV_MODE=1``)."""
    if url is not None:
        running = VllmServer(python, Path(), cache_blocks=runs[0][0].cache_blocks, port=int(url.rsplit(":", 1)[1]))
        _warm_up(running)
        return [_workload_arms(w, caps, controller, running) for w, caps, controller in runs]
    folder = Path(tempfile.mkdtemp(prefix="rota-vllm-"))
    model = write_model(folder / "model")
    results: dict[int, dict[str, Any]] = {}
    for blocks in dict.fromkeys(w.cache_blocks for w, _, _ in runs):
        log = (log_dir or folder) / f"vllm-{blocks}-blocks.log"
        agents = max(w.agents for w, _, _ in runs if w.cache_blocks == blocks)
        server = VllmServer(python, model, cache_blocks=blocks, max_num_seqs=max(8, agents), log_path=log)
        print(f"vllm: starting a server with {blocks} KV blocks (log {log})", file=sys.stderr, flush=True)
        with server:
            _warm_up(server)
            for i, (w, caps, controller) in enumerate(runs):
                if w.cache_blocks == blocks:
                    results[i] = _workload_arms(w, caps, controller, server)
    return [results[i] for i in range(len(runs))]
