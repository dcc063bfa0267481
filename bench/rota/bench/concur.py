"""`rota bench concur`: agent-level admission control (CONCUR) against admit-all and the best static cap.

    rota bench concur [--engine rota|vllm] [--clock fitted|measured] [--install-vllm]
                      [--vllm-url URL] [--repeats N] [--config FILE] [--json] [--render DIR]
    python -m rota.bench.concur ...   (the same, without the CLI)

``--engine vllm`` runs the same arms against a real vLLM server on the CPU in wall-clock
time (`rota.bench.concur_vllm`; its own virtual environment, see `rota.bench.vllm_server`);
the rest of this note is about our engine. With ``--clock fitted`` the JSON's
``clock_fit.against_measured`` gives the fit's error against every step's measured time.

Each workload runs three arms on the same engine (`rota.jobkit.inference`: a real paged-KV
transformer on the CPU, prefix caching, LRU eviction, recompute by real prefill) and the
same seeded agents: **admit_all** (every agent active at once), **static_best** (the best
of a sweep of fixed caps, which needs the hindsight no online system has; admit-all is the
sweep's largest cap) and **controller** (`rota.jobkit.inference.kv_window`, reading the engine's
Prometheus text each control interval through the same parser that scrapes a real
vLLM/SGLang `/metrics`; in-process here, over real HTTP in the tests and the example job).
Time is the virtual clock of `rota.jobkit.inference.agents`: tool calls cost their drawn latency;
an engine step costs, by default (`--clock fitted`), what a linear model of its work
fitted to this machine's measured step times at the start of the run says, so every arm
pays the same for the same work and the arms' ratios do not wander with the machine's
load; `--clock measured` charges each step its own measured CPU time. Per arm: generated tokens per second, makespan,
recomputed prefill tokens per generated token, prefix hit rate, mean cache usage,
evictions, and a series per window (tokens/s, active agents, usage, hit rate).

The config (JSON): `{"workloads": [{"name", "agents", "turns", "gen_tokens", "obs_tokens",
"tool_latency_s", "cache_blocks", "seed", ...optional: "prompt_tokens",
"shared_prefix_tokens", "token_budget", "control_interval_s", "series_interval_s",
"caps": [...]}], "controller": {ControllerConfig fields}}`. Impossible settings are
refused naming the field: `rota: <field>: <reason>`, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from rota.bench.fitted_clock import CheckedClock, FittedClock, calibrate, fit_error
from rota.jobkit.inference.agents import RunResult, Workload, parse_workload, run_workload, static_gate
from rota.jobkit.inference.clock import MeasuredClock, StepClock
from rota.jobkit.inference.engine import Engine
from rota.jobkit.inference.kv_climb import ClimbConfig, GoodputClimb
from rota.jobkit.inference.kv_window import AdmissionController, CacheSample, ControllerConfig
from rota.jobkit.inference.metrics_http import render
from rota.jobkit.inference.model import ModelConfig
from rota.jobkit.inference.scrape import sample_from_text

# Ours, chosen by measurement with this benchmark (CONCUR's constants are not published):
# the threshold law's window starts at half the agents (W_INIT_FRACTION) and doubles until the first
# eviction, then grows by one per interval; a decrease halves it, or, when a fraction f of
# the interval's queried tokens was recomputed, cuts it to max(0.25, 1 - f) of itself if
# that is deeper, at most once per 0.3 s of virtual time; the control interval is 0.1 s
# (CONTROL_INTERVAL_S, the workloads' default here).
CONTROLLER = ControllerConfig(w_init=4, additive_step=1, decrease_factor=0.5, usage_high=0.9, hit_drop=0.10,
                              ewma_alpha=0.3, recompute_tolerance=0.05, cooldown_s=0.3, slow_start=True,
                              pause_on_shrink=True, severity_floor=0.25)
W_INIT_FRACTION = 1 / 2
CONTROL_INTERVAL_S = 0.1
# The controller arm's law (`"law"` in a config): "climb", a hill-climb of the window on
# measured goodput with preemption and recompute as a fast back-off (`rota.jobkit.inference.kv_climb`;
# its constants, CLIMB, are ours, chosen on the thrash shape of DEFAULT_WORKLOADS), or "threshold", the
# thresholds of `kv_window` alone (CONTROLLER), kept for comparison.
# fit_samples 2 (of 1, 2, 3) chosen on the same three shapes; fit_headroom 0.75 (of 0.7, 0.75,
# 0.8, 0.85, 0.9, 1.0) on the three shapes of bench/concur/seeds.json (four seeds each) under
# four calibrations of the fitted clock, once admission within the cache and sizes from
# finished agents had changed what the bound meets (0.7 had been chosen on one). The climb
# starts with every agent admitted (CLIMB_W_INIT_FRACTION): before the cache binds a smaller
# start only costs time, and the first congestion signal cuts straight to what fits.
# queue_samples 1: one scrape showing a queue that the free cache cannot take
# is congestion (vLLM's queue at a thrashing batch lasts seconds; 1 and 2 gave the same
# figures on the three tuning shapes, so the earlier signal was kept).
CLIMB = ClimbConfig(epoch_intervals=2, tolerance=0.1, backoff=0.7, max_step_fraction=0.5, epoch_tokens_per_agent=4.0,
                    fit_headroom=0.75, fit_samples=2, queue_samples=1)
CLIMB_W_INIT_FRACTION = 1.0
LAWS = ("climb", "threshold")
# Ours: wall-clock runs on vLLM repeat every arm this many times by default (one run of an
# arm wanders by 10-30% on a 2-core machine; the median of 3 interleaved runs is a sitting)
VLLM_REPEATS = 3


@dataclass(frozen=True)
class Policy:
    base: ControllerConfig
    climb: ClimbConfig | None  # None: the threshold law
    w_init: int | None  # None: W_INIT_FRACTION of each workload's agents

DEFAULT_WORKLOADS: list[dict[str, Any]] = [
    # Mid-phase thrashing: histories of 24 agents outgrow a cache that holds about eight.
    {"name": "thrash", "agents": 24, "turns": [3, 8], "gen_tokens": 16, "obs_tokens": 96,
     "tool_latency_s": [0.02, 0.1], "cache_blocks": 256, "seed": 1},
    # Another shape: fewer agents, longer turns and tool calls; the thrash workload's cap is wrong here.
    {"name": "long_turns", "agents": 12, "turns": [2, 4], "gen_tokens": 48, "obs_tokens": 160,
     "tool_latency_s": [0.1, 0.4], "cache_blocks": 224, "seed": 2},
    # Ample cache: nothing to gain, nothing to lose.
    {"name": "ample", "agents": 16, "turns": [3, 6], "gen_tokens": 24, "obs_tokens": 48,
     "tool_latency_s": [0.02, 0.1], "cache_blocks": 1024, "seed": 3},
]


def in_process_sample(engine: Engine) -> CacheSample | None:
    """The engine's /metrics text, parsed as a scrape of a real server would be."""
    return sample_from_text(render(engine.snapshot()))


def default_caps(agents: int) -> list[int]:
    return sorted({max(1, round(agents * f)) for f in (1 / 4, 1 / 3, 1 / 2, 1.0)})


def _climb(raw: dict[str, Any]) -> ClimbConfig | None:
    law = raw.get("law", "climb")
    if law not in LAWS:
        raise ValueError(f"law: must be one of {', '.join(LAWS)}, got {law!r}")
    climb = raw.get("climb", {})
    known = {f.name for f in fields(ClimbConfig)}
    if not isinstance(climb, dict) or set(climb) - known:
        bad = sorted(set(climb) - known) if isinstance(climb, dict) else ["climb"]
        raise ValueError(f"climb.{bad[0]}: unknown climb field (known: {', '.join(sorted(known))})")
    try:
        return replace(CLIMB, **climb) if law == "climb" else None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"climb.{exc}") from None


def parse_config(raw: Any) -> tuple[list[tuple[Workload, list[int]]], Policy]:
    if not isinstance(raw, dict):
        raise ValueError("config: must be a JSON object with a \"workloads\" list")
    unknown = sorted(set(raw) - {"workloads", "controller", "climb", "law"})
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown config field (known: climb, controller, law, workloads)")
    entries = raw.get("workloads")
    if not isinstance(entries, list) or not entries:
        raise ValueError("workloads: must be a non-empty list")
    controller = raw.get("controller", {})
    known = {f.name for f in fields(ControllerConfig)}
    if not isinstance(controller, dict) or set(controller) - known:
        bad = sorted(set(controller) - known) if isinstance(controller, dict) else ["controller"]
        raise ValueError(f"controller.{bad[0]}: unknown controller field (known: {', '.join(sorted(known))})")
    try:
        base = replace(CONTROLLER, **controller)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"controller.{exc}") from None
    w_init = controller.get("w_init")  # else W_INIT_FRACTION of each workload's agents
    out: list[tuple[Workload, list[int]]] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"workloads[{i}]: must be an object")
        entry = dict(entry)
        entry.setdefault("control_interval_s", CONTROL_INTERVAL_S)
        caps = entry.pop("caps", None)
        w = parse_workload(entry)
        if caps is None:
            caps = default_caps(w.agents)
        if not isinstance(caps, list) or not caps or not all(isinstance(c, int) and 1 <= c <= w.agents for c in caps):
            raise ValueError(f"caps: must be a non-empty list of integers in [1, agents={w.agents}], got {caps!r}")
        out.append((w, sorted(set(caps) | {w.agents})))
    return out, Policy(base, _climb(raw), w_init)


def controller_for(w: Workload, policy: Policy) -> AdmissionController:
    base = policy.base
    fraction = W_INIT_FRACTION if policy.climb is None else CLIMB_W_INIT_FRACTION
    start = policy.w_init if policy.w_init is not None else max(1, round(w.agents * fraction))
    config = replace(base, w_max=w.agents, w_init=max(base.w_min, min(start, w.agents)))
    return AdmissionController(config) if policy.climb is None else GoodputClimb(config, policy.climb)


def run_arms(w: Workload, caps: list[int], policy: Policy, clock: StepClock) -> dict[str, Any]:
    started = time.perf_counter()
    sweep: dict[int, RunResult] = {cap: run_workload(w, static_gate(cap), clock=clock) for cap in caps}
    controller = run_workload(w, controller_for(w, policy), sample=in_process_sample, clock=clock)
    return workload_result(w, sweep, controller, time.perf_counter() - started)


def workload_result(w: Workload, sweep: dict[int, RunResult], controller: RunResult, wall_s: float) -> dict[str, Any]:
    """One workload's arms and ratios, the same on both engines."""
    admit_all = sweep[w.agents]
    best_cap = max(sweep, key=lambda c: sweep[c].tokens_per_s)
    ctl = controller.as_json()
    windows = [d["window"] for d in controller.decisions]
    ctl.update({"final_window": windows[-1] if windows else None,
                "max_window": max(windows, default=None),
                "window_series": controller.decisions[:: max(1, len(controller.decisions) // 60)]})
    best = sweep[best_cap].as_json() | {"cap": best_cap,
                                        "sweep": {str(c): round(r.tokens_per_s, 2) for c, r in sweep.items()}}
    return {
        "name": w.name,
        "arms": {"admit_all": admit_all.as_json(), "static_best": best, "controller": ctl},
        "ratios": {
            "controller_vs_admit_all": round(controller.tokens_per_s / admit_all.tokens_per_s, 3),
            "controller_vs_static_best": round(controller.tokens_per_s / sweep[best_cap].tokens_per_s, 3),
            "static_best_vs_admit_all": round(sweep[best_cap].tokens_per_s / admit_all.tokens_per_s, 3),
        },
        "wall_s": round(wall_s, 1),
    }


def _print(result: dict[str, Any]) -> None:
    head = f"{'workload':<11} {'arm':<12} {'cap':>4} {'tok/s':>8} {'makespan':>9} {'recomp':>7} {'hit':>5} " \
           f"{'usage':>6} {'evict':>6} {'preempt':>7}"
    print(head)
    for wl in result["workloads"]:
        for arm, r in wl["arms"].items():
            cap = r.get("cap", r.get("final_window", "")) if arm != "admit_all" else "all"
            if arm == "controller":
                cap = f"~{r['max_window']}"
            print(f"{wl['name']:<11} {arm:<12} {cap!s:>4} {r['tokens_per_s']:>8.1f} {r['makespan_s']:>8.2f}s "
                  f"{r['recompute_ratio']:>7.2f} {r['hit_rate']:>5.2f} {r['mean_cache_usage']:>6.2f} "
                  f"{r['evictions']:>6} {r['preemptions']:>7}")
        q = wl["ratios"]
        print(f"{'':<11} controller/admit_all {q['controller_vs_admit_all']:.2f}x, controller/static_best "
              f"{q['controller_vs_static_best']:.2f}x, static sweep {wl['arms']['static_best']['sweep']}")


def _smooth(values: list[float], width: int = 5) -> list[float]:
    """A centred moving average: agents' turns fall into step, so single windows swing."""
    half = width // 2
    return [sum(values[max(0, i - half):i + half + 1]) / len(values[max(0, i - half):i + half + 1])
            for i in range(len(values))]


def render_pictures(result: dict[str, Any], folder: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    rows = len(result["workloads"])
    fig, axes = plt.subplots(rows, 2, figsize=(12, 3.4 * rows), squeeze=False)
    colours = {"admit_all": "tab:red", "static_best": "tab:green", "controller": "tab:blue"}
    styles = {"admit_all": "-", "static_best": "--", "controller": "-"}  # a best cap of "all" stays visible
    for row, wl in zip(axes, result["workloads"], strict=True):
        for arm, r in wl["arms"].items():
            series = r["series"]
            total = max(series[-1]["progress_tokens"], 1) if series else 1
            x = [p["progress_tokens"] / total for p in series]
            label = f"{arm}" + (f" (cap {r['cap']})" if arm == "static_best" else "") + f": {r['tokens_per_s']:.0f} tok/s"
            row[0].plot(x, _smooth([p["tokens_per_s"] for p in series]), styles[arm], color=colours[arm], label=label,
                        lw=1.4)
            row[1].plot(x, [p["active_agents"] for p in series], styles[arm], color=colours[arm], label=arm, lw=1.4)
        row[0].set_title(f"{wl['name']}: generated tokens/s over batch progress (mean of 5 windows)")
        row[0].set_xlabel("batch progress (fraction of generated tokens)")
        row[0].set_ylabel("tokens/s")
        row[0].legend(fontsize=8)
        row[1].set_title(f"{wl['name']}: active agents")
        row[1].set_xlabel("batch progress (fraction of generated tokens)")
        row[1].set_ylabel("agents")
    fig.tight_layout()
    path = folder / "concur.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rota bench concur", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="a JSON file of workloads (default: the three built in)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--render", type=Path, metavar="DIR", help="draw throughput over batch progress into DIR")
    parser.add_argument("--engine", choices=("rota", "vllm"), default="rota",
                        help="rota.jobkit.inference in process (default) or a real vLLM server on the CPU, "
                             "from the virtual environment at $ROTA_VLLM_VENV")
    parser.add_argument("--clock", choices=("fitted", "measured"), default=None,
                        help="rota: an engine step costs a model fitted to measured steps (default; the same price "
                             "for the same work in every arm) or its own measured CPU time; vllm: measured wall "
                             "time only (the default there)")
    parser.add_argument("--install-vllm", action="store_true",
                        help="with --engine vllm: create $ROTA_VLLM_VENV and install vLLM there if missing")
    parser.add_argument("--vllm-url", metavar="URL",
                        help="with --engine vllm: use the vLLM server already running at URL (e.g. "
                             "http://127.0.0.1:8000, its KV cache sized for the workloads) instead of starting one")
    parser.add_argument("--repeats", type=int, default=None, metavar="N",
                        help="with --engine vllm: run every arm N times (default 3), interleaved (each repeat in an "
                             "order rotated by one arm), and report each arm's median run and the ratios per repeat: "
                             "one wall-clock run of an arm wanders by 10-30%% on a shared machine")
    args = parser.parse_args(argv)
    if args.clock is None:
        args.clock = "measured" if args.engine == "vllm" else "fitted"
    if args.repeats is None:
        args.repeats = VLLM_REPEATS if args.engine == "vllm" else 1
    return args


def _load(args: argparse.Namespace) -> tuple[list[tuple[Workload, list[int]]], Policy]:
    raw: Any = {"workloads": DEFAULT_WORKLOADS}
    if args.engine == "vllm" and args.clock != "measured":
        raise ValueError("--clock: vLLM runs in measured wall-clock time only")
    if args.repeats < 1:
        raise ValueError(f"--repeats: must be at least 1, got {args.repeats}")
    if args.repeats > 1 and args.engine != "vllm":
        raise ValueError("--repeats: only with --engine vllm (our engine's fitted clock prices the same work alike)")
    if args.config is not None:
        try:
            raw = json.loads(args.config.read_text())
        except OSError as exc:
            raise ValueError(f"--config: cannot read {args.config}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"--config: {args.config} is not JSON: {exc}") from None
    return parse_config(raw)


def _run_rota(args: argparse.Namespace, workloads: list[tuple[Workload, list[int]]], policy: Policy) -> dict[str, Any]:
    torch.set_num_threads(1)  # the step's cost is this thread's CPU time
    clock: StepClock
    checked: CheckedClock | None = None
    if args.clock == "fitted":
        fitted: FittedClock = calibrate(ModelConfig())
        clock = checked = CheckedClock(fitted)
    else:
        clock = MeasuredClock()
    result: dict[str, Any] = {"engine": "rota", "clock": args.clock,
                              "workloads": [run_arms(w, caps, policy, clock) for w, caps in workloads]}
    if checked is not None:
        result["clock_fit"] = checked.fitted.describe() | {"against_measured": fit_error(checked.pairs)}
    return result


def _run_vllm(args: argparse.Namespace, workloads: list[tuple[Workload, list[int]]], policy: Policy) -> dict[str, Any]:
    from rota.bench.concur_vllm import run_vllm_arms, vllm_or_reason

    # a running server needs no import probe of the venv (minutes on a loaded machine)
    python = vllm_or_reason(args.install_vllm) if args.vllm_url is None else Path(sys.executable)
    if isinstance(python, str):
        return {"engine": "vllm", "clock": "measured", "skipped": python, "workloads": []}
    ran = run_vllm_arms(python, [(w, caps, partial(controller_for, w, policy)) for w, caps in workloads],
                        url=args.vllm_url, repeats=args.repeats)
    out = [workload_result(w, r["sweep"], r["controller"], r["wall_s"]) | ({"repeats": r["repeats"]} if "repeats" in r
                                                                           else {})
           for (w, _), r in zip(workloads, ran, strict=True)]
    return {"engine": "vllm", "clock": "measured", "workloads": out}


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        workloads, policy = _load(args)
    except ValueError as exc:
        print(f"rota: {exc}", file=sys.stderr)
        return 2
    run = _run_vllm if args.engine == "vllm" else _run_rota
    result = run(args, workloads, policy)
    result["controller_constants"] = asdict(policy.base) | {
        "w_init": policy.w_init if policy.w_init is not None
        else f"{W_INIT_FRACTION if policy.climb is None else CLIMB_W_INIT_FRACTION:.3f} x agents",
        "law": "threshold" if policy.climb is None else "climb",
        "climb": None if policy.climb is None else asdict(policy.climb)}
    if "skipped" in result:
        print(f"rota bench concur: skipped: {result['skipped']}", file=sys.stderr)
    if args.render is not None and result["workloads"]:
        path = render_pictures(result, args.render)
        if not args.json:
            print(f"picture: {path}")
    if args.json:
        json.dump(result, sys.stdout)
        print()
    elif result["workloads"]:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
