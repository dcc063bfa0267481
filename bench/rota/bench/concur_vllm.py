"""`rota bench concur --engine vllm`: the three arms against a real vLLM server, in wall-clock time.

One server per workload (its KV cache is sized in blocks at start-up, ``cache_blocks`` of
16 tokens, as on our engine); the prefix cache is reset before each arm. Arms run one
after another on the same server: admit-all, each static cap of the sweep, the controller
(the same ``AdmissionController`` and constants as on our engine, a fresh one per run,
scraping the server's ``/metrics`` over HTTP). Agents are HTTP clients
(`rota.bench.concur_live`).

With ``repeats`` > 1 every arm runs that many times, interleaved: each repeat runs all arms,
in an order rotated by one arm per repeat, so that a slow spell of a shared machine falls
on every arm alike. Each arm then reports its median run (by tokens/s; that run's own
counters and window series), and ``repeats`` gives every run's tokens/s and the ratios of
the controller to admit-all and to the best cap within each repeat.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rota.bench.concur_live import LiveServer, run_live
from rota.bench.vllm_server import BLOCK_TOKENS, TINY_LLAMA, VllmServer, ensure_vllm, venv_path, write_model
from rota.jobkit.inference.admission import ScrapedAdmission
from rota.jobkit.inference.agents import RunResult, Workload, static_gate
from rota.jobkit.inference.kv_window import AdmissionController

__all__ = ["arm_order", "median_run", "repeats_summary", "run_vllm_arms", "vllm_or_reason"]

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


ControllerFactory = Callable[[], AdmissionController]
CONTROLLER_ARM = 0  # the controller's key among the arms (caps are at least 1)


def arm_order(arms: list[int], repeat: int) -> list[int]:
    """The arms of one repeat: the first repeat's order rotated by ``repeat`` places."""
    k = repeat % len(arms)
    return arms[k:] + arms[:k]


def median_run(runs: list[RunResult]) -> RunResult:
    """The run of median tokens/s (the lower middle one of an even count): a real run, so
    its counters and window series belong together."""
    ranked = sorted(runs, key=lambda r: r.tokens_per_s)
    return ranked[(len(ranked) - 1) // 2]


def repeats_summary(runs: dict[int, list[RunResult]], agents: int) -> dict[str, Any]:
    """Every run's tokens/s per arm, and the controller's ratios within each repeat."""
    best = max((c for c in runs if c != CONTROLLER_ARM),
               key=lambda c: statistics.median(r.tokens_per_s for r in runs[c]))
    ctl = runs[CONTROLLER_ARM]
    vs_all = [round(c.tokens_per_s / a.tokens_per_s, 3) for c, a in zip(ctl, runs[agents], strict=True)]
    vs_best = [round(c.tokens_per_s / b.tokens_per_s, 3) for c, b in zip(ctl, runs[best], strict=True)]
    return {
        "count": len(ctl),
        "tokens_per_s": {("controller" if c == CONTROLLER_ARM else f"cap {c}"): [round(r.tokens_per_s, 2) for r in rs]
                         for c, rs in runs.items()},
        "controller_vs_admit_all": {"per_repeat": vs_all, "median": statistics.median(vs_all)},
        "controller_vs_static_best": {"per_repeat": vs_best, "median": statistics.median(vs_best), "cap": best},
    }


def _workload_arms(w: Workload, caps: list[int], controller: ControllerFactory,
                   server: VllmServer, repeats: int = 1) -> dict[str, Any]:
    started = time.perf_counter()
    arms = [*sorted(caps, reverse=True), CONTROLLER_ARM]
    runs: dict[int, list[RunResult]] = {arm: [] for arm in arms}
    for repeat in range(repeats):
        for arm in arm_order(arms, repeat):
            controlled = arm == CONTROLLER_ARM
            result = _arm(w, server, controller() if controlled else static_gate(arm), controlled=controlled)
            runs[arm].append(result)
            name = "controller" if controlled else f"cap {arm}"
            print(f"vllm: {w.name} repeat {repeat + 1}/{repeats} {name}: {result.tokens_per_s:.1f} tok/s, "
                  f"makespan {result.makespan_s:.1f}s, hit rate {result.hit_rate:.2f}, recompute "
                  f"{result.recompute_ratio:.1f}, preemptions {result.preemptions}", file=sys.stderr, flush=True)
    sweep = {cap: median_run(runs[cap]) for cap in caps}
    out: dict[str, Any] = {"sweep": sweep, "controller": median_run(runs[CONTROLLER_ARM]),
                           "wall_s": round(time.perf_counter() - started, 1)}
    if repeats > 1:
        out["repeats"] = repeats_summary(runs, w.agents)
    return out


def run_vllm_arms(python: Path, runs: list[tuple[Workload, list[int], ControllerFactory]],
                  log_dir: Path | None = None, url: str | None = None, repeats: int = 1) -> list[dict[str, Any]]:
    """Every workload's arms; one server per cache size (a server takes minutes to start
    here), or, with ``url``, the server already running there (started with
    ``--num-gpu-blocks-override`` for the workloads' ``cache_blocks``, and ``VLLM_SERVER_DEV_MODE=1``)."""
    if url is not None:
        running = VllmServer(python, Path(), cache_blocks=runs[0][0].cache_blocks, port=int(url.rsplit(":", 1)[1]))
        _warm_up(running)
        return [_workload_arms(w, caps, controller, running, repeats) for w, caps, controller in runs]
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
                    results[i] = _workload_arms(w, caps, controller, server, repeats)
    return [results[i] for i in range(len(runs))]
