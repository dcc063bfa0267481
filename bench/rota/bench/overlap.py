"""``rota bench overlap``: communication/computation overlap (Helix) on real gloo ranks.

Per case (block, rank count, link) it launches the ranks as processes
(:mod:`rota.bench.overlap_worker`) and reports the measured step time of (a) the
untransformed graph, timed twice in the same rounds (``baseline_s``, ``baseline_again_s``: their
gap is the noise), (b) Inductor's own reordering (``reorder_for_compute_comm_overlap`` with
its default passes) where it compiles on this build (null otherwise), (c) Rota's plan, always its
own fresh timing, also when the plan fell back to the untransformed graph (``plan_kept`` false);
the exposed communication (step minus the compute-only step of the same graph) before and after;
peak memory before and after; the simulator's predicted makespan and peak beside them; and the
keep margin the planner set from its own measured noise (``keep_margin``, null when the simulator
alone refused every candidate).

Links: ``loopback`` (gloo over 127.0.0.1; communication competes with compute for the same
cores) and ``shaped`` (each rank in its own network namespace, veth links shaped with
``tc tbf`` at ``--rate``; needs root, skipped with a message otherwise).

``--json`` prints ``{"cases": [...], "summary": {...}}`` (``summary``: ``plans_kept`` of ``plans``,
and how often Rota's step measured slower than the untransformed one, and beyond the noise);
``--detail FILE`` writes the rest (the plan, refusals, the planner's check, every candidate
measured and predicted, calibration).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rota.bench.overlap_net import RankNet, can_shape, shaped_link
from rota.jobkit.overlap.blocks import BLOCK_NAMES
from rota.jobkit.overlap.check import free_port

__all__ = ["CASE_KEYS", "main", "noise", "summarize"]

CASE_KEYS = ("block", "ranks", "link", "baseline_s", "baseline_again_s", "inductor_s", "rota_s", "exposed_comm_before_s",
             "exposed_comm_after_s", "peak_mb_before", "peak_mb_after", "predicted_s", "predicted_peak_mb",
             "plan_kept", "keep_margin")
LINKS = ("loopback", "shaped")


def _launch(args: argparse.Namespace, block: str, ranks: int, nets: list[RankNet] | None, out: Path) -> None:
    master = nets[0].address if nets else "127.0.0.1"
    port = 29400 + free_port() % 1000 if nets else free_port()
    procs = []
    try:
        for r in range(ranks):
            cmd = [sys.executable, "-m", "rota.bench.overlap_worker", "--rank", str(r), "--world", str(ranks),
                   "--master", master, "--port", str(port), "--block", block, "--k", str(args.k),
                   "--iters", str(args.iters), "--verify", str(args.verify), "--batch", str(args.batch), "--seq", str(args.seq),
                   "--model", str(args.model), "--hidden", str(args.hidden), "--out", str(out)]
            if args.inductor:
                cmd.append("--inductor")
            env = None
            if nets:
                env = {**os.environ, "GLOO_SOCKET_IFNAME": nets[r].interface}
                cmd = nets[r].prefix() + cmd
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                          stderr=None if args.verbose else subprocess.DEVNULL))
        codes = [p.wait(timeout=args.case_timeout) for p in procs]
        if any(codes):
            raise RuntimeError(f"case {block} on {ranks} ranks: rank exit codes {codes} (rerun with --verbose)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _run_case(args: argparse.Namespace, block: str, ranks: int, link: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rota-overlap-") as tmp:
        out = Path(tmp) / "case.json"
        if link == "shaped":
            with shaped_link(ranks, rate=args.rate) as nets:
                _launch(args, block, ranks, nets, out)
        else:
            _launch(args, block, ranks, None, out)
        result = json.loads(out.read_text())
    case = {"block": block, "ranks": ranks, "link": link, **result["case"]}
    return {"case": {k: case[k] for k in CASE_KEYS}, "detail": {"block": block, "ranks": ranks, "link": link,
                                                                   **result["detail"]}}


def noise(case: dict[str, Any]) -> float:
    """The relative gap between the case's two timings of the untransformed graph."""
    a, b = case["baseline_s"], case["baseline_again_s"]
    return abs(a - b) / ((a + b) / 2) if a + b > 0 else 0.0


def summarize(cases: list[dict[str, Any]]) -> dict[str, int]:
    """Plans kept, and Rota's fresh step against the untransformed one: slower at all, and slower
    by more than the untransformed graph's own noise in that case."""
    slower = [c for c in cases if c["rota_s"] > c["baseline_s"]]
    return {"plans": len(cases), "plans_kept": sum(1 for c in cases if c["plan_kept"]),
            "rota_slower": len(slower),
            "rota_slower_beyond_noise": sum(1 for c in slower if c["rota_s"] / c["baseline_s"] - 1 > noise(c))}


def _summary_line(summary: dict[str, int]) -> str:
    n = summary["plans"]
    return (f"{summary['plans_kept']} of {n} plans kept; Rota's step slower than the untransformed in "
            f"{summary['rota_slower']} of {n} ({summary['rota_slower_beyond_noise']} beyond the untransformed "
            f"graph's own noise)")


def _pct(after: float, before: float) -> str:
    return f"{100 * (1 - after / before):+.0f}%" if before > 0 else "n/a"


def _table(cases: list[dict[str, Any]], details: list[dict[str, Any]]) -> str:
    lines = [f"{'block':8} {'n':>2} {'link':8} {'base ms':>8} {'again':>8} {'ind ms':>8} {'rota ms':>8} {'exp before':>10} "
             f"{'exp after':>9} {'exp cut':>7} {'peak MB':>13} {'pred ms':>8} {'err':>5} {'pred MB':>7} {'err':>5}  plan"]
    for c, d in zip(cases, details, strict=True):
        ind = f"{c['inductor_s'] * 1e3:8.2f}" if c["inductor_s"] is not None else f"{'null':>8}"
        err_t = c["predicted_s"] / c["rota_s"] - 1 if c["rota_s"] else 0.0
        err_m = c["predicted_peak_mb"] / c["peak_mb_after"] - 1 if c["peak_mb_after"] else 0.0
        lines.append(
            f"{c['block']:8} {c['ranks']:>2} {c['link']:8} {c['baseline_s'] * 1e3:8.2f} {c['baseline_again_s'] * 1e3:8.2f} "
            f"{ind} {c['rota_s'] * 1e3:8.2f} "
            f"{c['exposed_comm_before_s'] * 1e3:10.2f} {c['exposed_comm_after_s'] * 1e3:9.2f} "
            f"{_pct(c['exposed_comm_after_s'], c['exposed_comm_before_s']):>7} "
            f"{c['peak_mb_before']:6.2f}>{c['peak_mb_after']:6.2f} {c['predicted_s'] * 1e3:8.2f} {err_t:+5.0%} "
            f"{c['predicted_peak_mb']:7.2f} {err_m:+5.0%}  {d['plan']}{_margin(c)}")
        if c["inductor_s"] is None:
            lines.append(f"{'':20} inductor: {d['inductor_reason']}")
    return "\n".join(lines)


def _margin(case: dict[str, Any]) -> str:
    return f" (keep margin {case['keep_margin']:.0%})" if case["keep_margin"] is not None else " (simulator refused)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rota bench overlap", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--blocks", nargs="+", default=list(BLOCK_NAMES), choices=BLOCK_NAMES)
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--links", nargs="+", default=list(LINKS), choices=LINKS)
    parser.add_argument("--rate", default="500mbit", help="shaped link rate per rank, tc syntax (default 500mbit)")
    parser.add_argument("--k", type=int, default=2, help="tile streams (default 2)")
    parser.add_argument("--iters", type=int, default=60, help="timed rounds (one step of every variant each; default 60)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--model", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--no-inductor", dest="inductor", action="store_false",
                        help="skip Inductor's reordering (it compiles C++ per case: minutes on 2 cores)")
    parser.add_argument("--verify", type=int, default=40,
                        help="steps the planner times its choice against the untransformed graph (0: trust the simulator)")
    parser.add_argument("--case-timeout", type=float, default=900.0)
    parser.add_argument("--detail", help="write plans, refusals and calibration per case as JSON here")
    parser.add_argument("--verbose", action="store_true", help="show the ranks' stderr")
    return parser


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.verify < 0:
        parser.error(f"--verify must be at least 0, got {args.verify}")
    for field in ("k", "iters", "batch", "seq", "model", "hidden"):
        if getattr(args, field) < 1:
            parser.error(f"--{field} must be at least 1, got {getattr(args, field)}")
    if args.k < 2:
        parser.error(f"--k must be at least 2, got {args.k}")
    if any(r < 2 for r in args.ranks):
        parser.error(f"--ranks must each be at least 2, got {args.ranks}")


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    links = list(args.links)
    if "shaped" in links and (why := can_shape()):
        print(f"skipping shaped cases: {why}", file=sys.stderr)
        links.remove("shaped")
    cases: list[dict[str, Any]] = []
    details: list[dict[str, Any]] = []
    for link in links:
        for ranks in args.ranks:
            for block in args.blocks:
                print(f"case {block} ranks={ranks} link={link} ...", file=sys.stderr, flush=True)
                result = _run_case(args, block, ranks, link)
                cases.append(result["case"])
                details.append(result["detail"])
    if args.detail:
        Path(args.detail).write_text(json.dumps({"cases": details}, indent=1))
    summary = summarize(cases)
    if args.json:
        print(json.dumps({"cases": cases, "summary": summary}))
    else:
        print(_table(cases, details))
        print(_summary_line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
