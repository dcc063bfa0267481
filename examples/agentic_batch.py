"""An agentic batch on the paged-KV engine, with CONCUR admission control inside the job.

The job runs `rota.jobkit.inference`'s engine (a small transformer, paged KV cache, prefix
caching, LRU eviction, recompute by real prefill) behind a real HTTP ``/metrics`` page
under vLLM's names, and the CONCUR controller (`rota.jobkit.inference.kv_window`) scraping that page
each control interval. It reports the window, cache usage, prefix hit rate, recompute
ratio and agents done with ``rota.runtime.report``, so they show in ``rota job ID`` and
``rota watch`` and reach the forecaster. An agent framework outside the job can use the
same window through ``POST /admit?agent=ID`` and ``POST /release?agent=ID`` on the port it
prints (``--port``); ``/admit`` takes an optional ``&tokens=N``, what the agent's next turn holds
(history and generation), and then admits it only where that fits in the KV cache.

Settings come as command-line arguments (a job file has no free-form fields; the job
file's ``command`` carries them). Tool calls take virtual time (a discrete clock; engine
steps cost their measured CPU time), so the batch runs as fast as the CPU allows.

With ``--state-dir DIR`` the job is resumable in the simplest way: each finished agent's
result is appended to ``DIR/agents_done.jsonl`` and the controller's window to
``DIR/controller.json``; a restarted job skips the finished agents and starts from the
saved window.

    python examples/agentic_batch.py --agents 16 --turns 3 6 --cache-blocks 256
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

import rota.runtime
from rota.jobkit.inference.admission import ScrapedAdmission, admission_routes
from rota.jobkit.inference.agents import Workload, engine_for, run_workload
from rota.jobkit.inference.engine import Engine
from rota.jobkit.inference.kv_window import AdmissionController, ControllerConfig, Decision
from rota.jobkit.inference.metrics_http import MetricsServer
from rota.jobkit.inference.scrape import scrape


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="an agentic batch with CONCUR admission control")
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--turns", type=int, nargs=2, default=[3, 6], metavar=("LO", "HI"))
    p.add_argument("--gen-tokens", type=int, default=24)
    p.add_argument("--obs-tokens", type=int, default=48)
    p.add_argument("--tool-latency", type=float, nargs=2, default=[0.02, 0.1], metavar=("LO", "HI"))
    p.add_argument("--cache-blocks", type=int, default=256)
    p.add_argument("--token-budget", type=int, default=512)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--control-interval", type=float, default=0.25, help="virtual seconds between scrapes")
    p.add_argument("--window", type=int, default=4, help="the controller's initial window")
    p.add_argument("--port", type=int, default=0, help="port of /metrics, /admit, /release, /window (0: any)")
    p.add_argument("--state-dir", type=Path, default=None, help="keep finished agents and the window here")
    return p.parse_args(argv)


def _saved_state(state_dir: Path | None) -> tuple[Path | None, Path | None, dict[str, dict[str, Any]], dict[str, Any] | None]:
    """What a restarted run finds in --state-dir: (its agents-done file, its controller file,
    the agents already done, the controller's saved state)."""
    done_file = controller_file = None
    finished: dict[str, dict[str, Any]] = {}
    state: dict[str, Any] | None = None
    if state_dir is None:
        return done_file, controller_file, finished, state
    state_dir.mkdir(parents=True, exist_ok=True)
    done_file, controller_file = state_dir / "agents_done.jsonl", state_dir / "controller.json"
    if done_file.exists():
        for line in done_file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                finished[row["agent"]] = row
    if controller_file.exists():
        saved = json.loads(controller_file.read_text(encoding="utf-8"))
        state = {"window": saved["window"], "slow_start": saved["slow_start"], "hit_ewma": saved["hit_ewma"]}
    return done_file, controller_file, finished, state


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        w = Workload(name="agentic-batch", agents=args.agents, turns=(args.turns[0], args.turns[1]),
                     gen_tokens=args.gen_tokens, obs_tokens=args.obs_tokens,
                     tool_latency_s=(args.tool_latency[0], args.tool_latency[1]), cache_blocks=args.cache_blocks,
                     seed=args.seed, token_budget=args.token_budget, control_interval_s=args.control_interval)
        config = ControllerConfig(w_max=w.agents, w_init=min(max(1, args.window), w.agents))
    except ValueError as exc:
        print(f"agentic_batch: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    done_file, controller_file, finished, state = _saved_state(args.state_dir)
    controller = AdmissionController(config, state=state)
    engine: Engine = engine_for(w)
    server = MetricsServer(engine.snapshot, port=args.port)
    admission = ScrapedAdmission(controller, server.url)
    server.add_routes(admission_routes(admission))
    print(f"agentic_batch: {w.agents} agents ({len(finished)} already done), metrics on {server.url}", flush=True)
    intervals = [0]

    def on_done(agent: str, history: list[int]) -> None:
        row = {"agent": agent, "tokens": len(history), "sha256": hashlib.sha256(json.dumps(history).encode()).hexdigest()}
        finished[agent] = row
        if done_file is not None:
            with done_file.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def on_interval(decision: Decision, e: Engine, now: float) -> None:
        intervals[0] += 1
        if intervals[0] % 2:
            return
        report(decision, e, now)
        if controller_file is not None:
            controller_file.write_text(json.dumps(controller.state()), encoding="utf-8")

    def report(decision: Decision, e: Engine, now: float) -> None:
        c = e.counters
        rota.runtime.report(
            window=decision.window, active=decision.active, held=decision.held, usage=round(c.usage, 4),
            hit_rate=round(c.prefix_hits / max(c.prefix_queries, 1), 4),
            recompute_ratio=round(c.recomputed / max(c.generated, 1), 4), agents_done=len(finished),
            agents=w.agents, generated=c.generated, tokens_per_s=round(c.generated / max(now, 1e-9), 1),
            signal=decision.action, admission_url=server.url.removesuffix("/metrics"),
        )

    try:
        result = run_workload(w, admission, engine=engine, sample=lambda _e: scrape(server.url),
                              skip=set(finished), on_done=on_done, on_interval=on_interval)
    finally:
        server.stop()
    if controller_file is not None:
        controller_file.write_text(json.dumps(controller.state()), encoding="utf-8")
    final = Decision(window=controller.window, action="done", reason="", active=0, held=0)
    report(final, engine, max(result.makespan_s, 1e-9))
    print(f"agentic_batch: {len(finished)}/{w.agents} agents done; {result.generated} tokens in "
          f"{result.makespan_s:.2f}s virtual ({result.tokens_per_s:.0f} tokens/s); hit rate {result.hit_rate:.2f}, "
          f"recompute ratio {result.recompute_ratio:.2f}, window {controller.window}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
