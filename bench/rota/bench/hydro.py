"""``rota bench hydro``: surrogate fidelity, fused-trial throughput, trials squeezed into pipeline bubbles.

Sections (all in one run unless ``--sections`` picks some):

- fidelity: Kendall tau of 12 configurations' held-out losses at S = 4 and S = 8 against
  S = 1, and the time to reach within 2% of the best full-scale loss for plain trials,
  scaled trials (S = 4, then the best transferred to full scale) and scaled + fused trials;
- fusion: trials per second one at a time, in two processes, and fused at B = 4, 8, 16, over
  the step loops only (setup, i.e. model build, data reading and evaluation, reported apart);
- bubbles: a 2-stage GPipe job (examples/pipeline_bubbles.py, gloo) alone, with a fused
  trial process always running on stage 0's core, and with it squeezed into the bubbles.

Every timing is taken on this machine in this run; ratios are against baselines measured in
the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from rota.bench.hydro_fidelity import Setup, fidelity, fusion

SECTIONS = ("fidelity", "fusion", "bubbles")


def _no_bubbles(reason: str) -> dict[str, Any]:
    return {"alone_step_s": None, "naive": {"step_s": None, "trial_share": None},
            "squeezed": {"step_s": None, "trial_share": None, "bubble_busy": None}, "alone_bubble_busy": None,
            "error": reason}


def _bubbles(quick: bool) -> dict[str, Any]:
    # The section needs two free-ish cores and process control; when it cannot run, its keys
    # are still there, null, with the reason.
    try:
        from rota.bench.hydro_bubbles import run_bubbles

        return run_bubbles(quick=quick)
    except (ImportError, OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return _no_bubbles(f"bubbles section did not run: {type(exc).__name__}: {exc}")


def _print_table(result: dict[str, Any]) -> None:
    fid = result.get("fidelity")
    if fid:
        print(f"fidelity ({fid['configs']} configs, {fid['steps']} steps): tau S=4 {fid['tau_s4']:.3f}, "
              f"S=8 {fid['tau_s8']:.3f} (fused S=4 {fid['tau_s4_fused']:.3f})")
        times = fid["time_to_target_s"]
        for arm in ("plain", "scaled", "fused"):
            value = times[arm]
            print(f"  time to within 2% of best full-scale loss, {arm:<6}: " + (f"{value:7.1f} s" if value is not None else "not reached"))
    fus = result.get("fusion")
    if fus:
        rates = fus["trials_per_s"]
        base = rates["sequential"]
        spread = fus.get("trials_per_s_range", {})
        walls, setups = fus.get("wall_trials_per_s", {}), fus.get("setup_s", {})
        print(f"fusion (trial = {fus['steps_per_trial']} steps at S={fus['scale']}): trials/s over the step loops, "
              f"median of {fus.get('repeats', 1)} interleaved rounds [min-max]; setup and wall time apart")
        for arm, rate in rates.items():
            low, high = spread.get(arm, [rate, rate])
            extra = (f"   setup {setups[arm]:6.2f} s, wall {walls[arm]:6.3f} trials/s" if arm in walls and arm in setups
                     else "")
            print(f"  {arm:<10} {rate:7.3f} [{low:.3f}-{high:.3f}]  ({rate / base:4.2f}x sequential){extra}")
    bub = result.get("bubbles")
    if bub:
        if bub.get("alone_step_s") is None:
            print(f"bubbles: not measured ({bub.get('error', 'unknown reason')})")
        else:
            alone = bub["alone_step_s"]
            print("bubbles (stage 0 of a 2-stage GPipe job; core busy fraction inside bubbles = CPU stand-in for SM activity)")
            print(f"  alone     step {alone * 1000:7.1f} ms                       bubble busy {bub['alone_bubble_busy']:.2f}")
            for arm in ("naive", "squeezed"):
                a = bub[arm]
                busy = f"bubble busy {a['bubble_busy']:.2f}" if a.get("bubble_busy") is not None else ""
                print(f"  {arm:<9} step {a['step_s'] * 1000:7.1f} ms ({a['step_s'] / alone - 1:+6.1%})  "
                      f"trial share {a['trial_share']:.2f}   {busy}")


def _render(result: dict[str, Any], folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    fid = result.get("fidelity")
    if fid:
        fig, ax = plt.subplots(figsize=(5, 4))
        for key, label in (("s4", f"S=4 (tau {fid['tau_s4']:.2f})"), ("s8", f"S=8 (tau {fid['tau_s8']:.2f})")):
            ax.scatter(fid["losses"]["s1"], fid["losses"][key], label=label)
        ax.set_xlabel("held-out loss at S=1")
        ax.set_ylabel("held-out loss of the surrogate")
        ax.legend()
        fig.tight_layout()
        path = folder / "hydro_fidelity.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    timeline = (result.get("bubbles") or {}).get("timeline")
    if timeline:
        fig, ax = plt.subplots(figsize=(9, 2.8))
        t0 = timeline["start"]
        for start, end in timeline["bubbles"]:
            ax.axvspan((start - t0) * 1000, (end - t0) * 1000, ymin=0.55, ymax=0.95, color="tab:orange", alpha=0.5)
        for start, end in timeline["compute"]:
            ax.axvspan((start - t0) * 1000, (end - t0) * 1000, ymin=0.55, ymax=0.95, color="tab:blue", alpha=0.8)
        for start, end in timeline["trial_running"]:
            ax.axvspan((start - t0) * 1000, (end - t0) * 1000, ymin=0.05, ymax=0.45, color="tab:green", alpha=0.8)
        ax.set_yticks([0.25, 0.75], ["trial resumed (SIGCONT..SIGSTOP)", "stage 0: compute (blue) / bubble (orange)"])
        ax.set_xlabel("ms")
        ax.set_title("stage 0 bubbles and the squeezed trial (2 squeezed steps)")
        fig.tight_layout()
        path = folder / "hydro_bubbles.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rota bench hydro", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--render", metavar="DIR", help="write pictures (matplotlib) into DIR")
    parser.add_argument("--quick", action="store_true", help="smaller budgets (about a third of the time)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--steps", type=int, default=None, help="training steps per fidelity trial (default 150, quick 60)")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    for section in chosen:
        if section not in SECTIONS:
            print(f"rota bench hydro: --sections: unknown section {section!r} (one of {', '.join(SECTIONS)})", file=sys.stderr)
            return 2
    if args.steps is not None and args.steps <= 0:
        print("rota bench hydro: --steps: must be positive", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)  # two spinning OpenMP threads on a shared 2-core machine are far slower
    steps = args.steps or (60 if args.quick else 150)
    setup = Setup(steps=steps)
    result: dict[str, Any] = {"fidelity": None, "fusion": None, "bubbles": None}
    if "fidelity" in chosen:
        result["fidelity"] = fidelity(setup)
    if "fusion" in chosen:
        result["fusion"] = fusion(setup, steps=10 if args.quick else 20)
    if "bubbles" in chosen:
        result["bubbles"] = _bubbles(args.quick)
    if args.render:
        result["pictures"] = _render(result, Path(args.render))
    if result.get("bubbles"):
        result["bubbles"].pop("timeline", None)  # pictured, too long for the JSON
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
