"""`rota bench slurm [--rounds N] [--array N] [--json]`: the same batch script through a real
Slurm and through Rota, in the same run, on this machine.

Slurm: Debian's slurm-wlm (slurmctld and one slurmd on 127.0.0.1, `--slots` CPU slots, its
default scheduler settings; `rota.bench.slurm_local`). Rota: a local cluster (`rota up`, one
node of `--slots` GPU slots, one allocator, one api worker, the default timers) driven by its
Slurm front door twice: as processes (`python -m rota.slurm sbatch|scancel|scontrol`, what
`rota-sbatch` runs: arm `rota`), and the same functions called in this process (arm
`rota_in_process`: what the commands cost without Python's start and imports).
Both run the same script (`rota.bench.slurm_conf.batch_script`), which stamps its own start
time and pids in a file; every figure is read from those stamps and from /proc, the same way
on both sides; rounds alternate which system goes first. Figures:
- submit call: the `sbatch` command's wall time; submit -> start: from just before `sbatch`
  to the script's own start stamp, one job at a time on an idle cluster;
- an array of N `sleep 0` jobs: from before `sbatch --array` to the last job's end stamp;
- cancel: from before `scancel` until the script's shell and its `sleep` are gone (/proc);
- requeue: from before `scontrol requeue` until the running copy is gone, and until it
  starts again (waited for up to `--requeue-wait` s; Slurm holds a requeued job back, and
  then its expected start is read from `squeue -o %S`).
Ratios are each Rota arm's median over Slurm's (below 1: Rota took less time; for
`array_jobs_per_s`, above 1 is Rota faster).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rota.bench.fault_harness import TENANT, Harness, alive_pids
from rota.bench.slurm_conf import (
    Start,
    batch_script,
    mark_key,
    parse_begin_time,
    parse_end,
    parse_starts,
    parse_submitted,
)
from rota.bench.slurm_local import LocalSlurm, missing

COMMAND = "rota bench slurm"


@dataclass
class Arm:
    name: str
    argv: dict[str, list[str]]  # sbatch, scancel, scontrol, squeue -> the command's argv prefix
    env: dict[str, str]
    marks: Path
    sbatch_extra: tuple[str, ...] = ()

    def call(self, name: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        t0 = time.perf_counter()
        done = subprocess.run([*self.argv[name], *args], env=self.env, cwd=self.marks, capture_output=True,
                              text=True, timeout=60)
        took = time.perf_counter() - t0
        if done.returncode != 0 and name != "squeue":
            raise RuntimeError(f"{self.name}: {name} {' '.join(args)}: {done.stderr.strip()[-400:]}")
        return done, took

    def submit(self, seconds: float, *args: str) -> tuple[str, float, float]:
        """(job number, wall time before the call, the call's seconds)."""
        script = self.marks / f"job-{seconds:g}.sh"
        if not script.exists():
            script.write_text(batch_script(self.marks, seconds))
        before = time.time()
        done, took = self.call("sbatch", "--parsable", *self.sbatch_extra, *args, str(script))
        return parse_submitted(done.stdout), before, took

    def starts(self, key: str) -> list[Start]:
        path = self.marks / f"{key}.start"
        return parse_starts(path.read_text()) if path.exists() else []


class InProcessArm(Arm):
    """Rota's Slurm commands called in this process (`rota.slurm.commands`, the code the CLI
    runs, a new connection each call): the front door without the interpreter's start."""

    def call(self, name: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        from rota.slurm import commands

        entry = {"sbatch": commands.sbatch, "scancel": commands.scancel, "scontrol": commands.scontrol,
                 "squeue": commands.squeue}[name]
        saved, cwd, out, err = dict(os.environ), Path.cwd(), io.StringIO(), io.StringIO()
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("ROTA_")})
        os.chdir(self.marks)
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = entry(list(args))
        finally:
            took = time.perf_counter() - t0
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(saved)
        if code != 0 and name != "squeue":
            raise RuntimeError(f"{self.name}: {name} {' '.join(args)}: {err.getvalue().strip()[-400:]}")
        return subprocess.CompletedProcess([name, *args], code, out.getvalue(), err.getvalue()), took


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout_s:.0f} s")
        time.sleep(0.02)
    return value


def end_stamp(path: Path) -> float | None:
    """A KEY.end file's time, once it is written (it exists, empty, for a moment before)."""
    try:
        return parse_end(path.read_text())
    except OSError:
        return None


def gone(pids: tuple[int, ...]) -> bool:
    return not alive_pids(pids)


def idle_round(arm: Arm) -> dict[str, float]:
    number, before, call = arm.submit(0.2)
    key = mark_key(number)
    first = wait_for(lambda: arm.starts(key), 120, f"{arm.name} job {number} start")[0]
    wait_for(lambda: end_stamp(arm.marks / f"{key}.end") is not None, 120, f"{arm.name} job {number} end")
    return {"submit_call_s": call, "submit_to_start_s": first.at - before}


def array_round(arm: Arm, jobs: int) -> dict[str, float]:
    number, before, call = arm.submit(0, f"--array=0-{jobs - 1}")
    ends = [arm.marks / f"{mark_key(number, i)}.end" for i in range(jobs)]
    def all_ended() -> list[float] | None:
        stamps = [end_stamp(p) for p in ends]
        return None if None in stamps else [t for t in stamps if t is not None]

    last = max(wait_for(all_ended, 600, f"{arm.name} array {number}'s {jobs} jobs to end"))
    return {"array_submit_call_s": call, "array_makespan_s": last - before, "array_jobs_per_s": jobs / (last - before)}


def running(arm: Arm) -> tuple[str, Start]:
    number, _, _ = arm.submit(300)
    return number, wait_for(lambda: arm.starts(mark_key(number)), 120, f"{arm.name} job {number} start")[0]


def cancel_round(arm: Arm) -> dict[str, float]:
    number, start = running(arm)
    before = time.monotonic()
    _, call = arm.call("scancel", number)
    wait_for(lambda: gone(start.pids), 120, f"{arm.name} job {number}'s processes gone after scancel")
    return {"scancel_call_s": call, "cancel_to_gone_s": time.monotonic() - before}


def requeue_round(arm: Arm, wait_s: float) -> dict[str, float]:
    number, start = running(arm)
    key, before_wall, before = mark_key(number), time.time(), time.monotonic()
    arm.call("scontrol", "requeue", number)
    wait_for(lambda: gone(start.pids), 120, f"{arm.name} job {number}'s processes gone after requeue")
    figures = {"requeue_to_gone_s": time.monotonic() - before}
    try:
        again = wait_for(lambda: s[1] if len(s := arm.starts(key)) > 1 else None, wait_s, f"{arm.name} restart")
        figures["requeue_to_restart_s"] = again.at - before_wall
    except TimeoutError:
        done, _ = arm.call("squeue", "-h", "-j", number, "-o", "%S")
        begin = parse_begin_time(done.stdout)
        if begin is not None:
            figures["requeue_to_eligible_s"] = begin - before_wall  # not waited for: the job's own BeginTime
    arm.call("scancel", number)
    wait_for(lambda: gone(tuple(p for s in arm.starts(key) for p in s.pids)), 120, f"{arm.name} job {number} cancelled")
    return figures


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4),
            "n": len(values)}


def run(arms: list[Arm], rounds: int, array_jobs: int, requeue_wait_s: float) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {arm.name: {} for arm in arms}

    def record(arm: Arm, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            samples[arm.name].setdefault(name, []).append(value)

    cases: list[Callable[[Arm], dict[str, float]]] = [idle_round] * rounds + [
        lambda a: array_round(a, array_jobs), *([cancel_round] * rounds),
        *([lambda a: requeue_round(a, requeue_wait_s)] * max(1, rounds // 2))]
    for i, case in enumerate(cases):
        for arm in arms if i % 2 == 0 else arms[::-1]:  # the order alternates
            record(arm, case(arm))
    out: dict[str, Any] = {arm: {k: summary(v) for k, v in figures.items()} for arm, figures in samples.items()}
    slurm = out["slurm"]
    for arm in arms:
        if arm.name != "slurm":
            mine = out[arm.name]
            out[f"{arm.name}_over_slurm"] = {k: round(mine[k]["median"] / slurm[k]["median"], 3)
                                             for k in mine if k in slurm and slurm[k]["median"] > 0}
    return out


def rota_arms(h: Harness, work: Path) -> list[Arm]:
    """Rota's Slurm commands as processes (what a user types), and the same code in-process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    env.update(ROTA_HOME=str(h.home), ROTA_SLURM_SPOOL=str(work / "spool"))
    prefix = [sys.executable, "-m", "rota.slurm"]
    argv = {n: [*prefix, n] for n in ("sbatch", "scancel", "scontrol", "squeue")}
    account = (f"--account={TENANT}",)
    return [Arm("rota", argv, env, work / "rota", sbatch_extra=account),
            InProcessArm("rota_in_process", argv, env, work / "rota_in_process", sbatch_extra=account)]


def slurm_arm(slurm: LocalSlurm, work: Path) -> Arm:
    return Arm("slurm", {n: [shutil.which(n) or n] for n in ("sbatch", "scancel", "scontrol", "squeue")},
               slurm.env, work / "slurm")


def _cell(s: dict[str, Any] | None) -> str:
    return "—" if s is None else f"{s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f})"


def table(report: dict[str, Any]) -> str:
    """A markdown table: each figure's median (min–max) per system, and Rota's over Slurm's."""
    arms = [a for a in ("rota", "rota_in_process") if a in report]
    rows = ["| figure, s (median, min–max) | Slurm | " + " | ".join(f"{a} | {a} / Slurm" for a in arms) + " |",
            "|---|---|" + "---|---|" * len(arms)]
    slurm = report["slurm"]
    for name in sorted(set(slurm).union(*(report[a] for a in arms))):
        cells = [f"{_cell(report[a].get(name))} | {report[f'{a}_over_slurm'].get(name, '—')}" for a in arms]
        rows.append(f"| {name} | {_cell(slurm.get(name))} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the idle-submit and cancel figures (requeue: half)")
    ap.add_argument("--array", type=int, default=20, help="jobs in the array figure")
    ap.add_argument("--slots", type=int, default=4, help="job slots on each side: Slurm CPUs, Rota GPU slots")
    ap.add_argument("--requeue-wait", type=float, default=20.0, help="seconds to wait for a requeued job's restart")
    ap.add_argument("--database-url", default="", help="Rota's PostgreSQL; default: an embedded one")
    ap.add_argument("--redis-url", default="", help="Rota's Redis; default: an embedded one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.array < 1 or args.slots < 1 or args.requeue_wait <= 0:
        ap.error("--rounds, --array, --slots and --requeue-wait must be positive")
    why = missing()
    if why:
        print(json.dumps({"skipped": why}) if args.json else f"{COMMAND}: skipped: {why}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="rota-bench-slurm-"))
    for side in ("rota", "rota_in_process", "slurm", "spool"):
        (work / side).mkdir()
    slurm = LocalSlurm(cpus=args.slots)
    h = Harness(work / "home", args.database_url, args.redis_url, nodes=1, gpus_per_node=args.slots, allocators=1,
                api_workers=1, proxy_postgres=False, fast_timers=False)
    started, load_before = time.monotonic(), os.getloadavg()
    try:
        slurm.start()
        h.start()
        report = run([slurm_arm(slurm, work), *rota_arms(h, work)], args.rounds, args.array, args.requeue_wait)
    except (RuntimeError, TimeoutError) as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 1
    finally:
        slurm.stop()
        h.stop()
        shutil.rmtree(work, ignore_errors=True)
    report.update(slots=args.slots, rounds=args.rounds, array_jobs=args.array, wall_s=round(time.monotonic() - started, 1),
                  load_average_before=[round(x, 2) for x in load_before],
                  load_average_after=[round(x, 2) for x in os.getloadavg()],
                  command=" ".join([COMMAND, *argv]))
    print(json.dumps(report) if args.json else f"{table(report)}\n\n{json.dumps(report, indent=2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
