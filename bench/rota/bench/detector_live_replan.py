"""The loop closed on the real pipeline job, live: `python -m rota.bench.detector_live_replan`.

On a local cluster (`rota up`: the machine's PostgreSQL and Redis when they answer on
their ports, else embedded ones), the 16-layer job of `examples/pipeline_failslow.py`
(4 stages of 4 blocks, checkpointing, ``accepts_layout_changes``) runs with every stage
process under its own CPU cap (`detector_real._Shares`). From iteration `THROTTLE_AT` the
cap of rank 1 is divided by 1.5 (a slow device); once the cluster's detector has flagged
the rank slow and `SLOW_AT_LEAST` iterations have run slow, ``rota replan JOB --apply
--layers 16`` checkpoints the job and restarts it with ``ROTA_LAYOUT``; the restarted
process of each rank joins its rank's cgroup under the cap it had (rank 1 stays slow).
The job's own log (stage 0: a line per step with its time, loss and busy times; a line
per start with its step and split) gives the three rates:

- before: iterations `BEFORE` (healthy, the old split);
- while slow: from `SETTLE` iterations after the throttle to the last step before the pause;
- after: `AFTER` iterations from `SETTLE` after the restart's first step (new split, still slow).

A run ends by cancelling the job; every cgroup is removed and the cluster stopped (also on
error). Timed runs go under the shared timing lock, one at a time.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rota.bench.detector_real import JOB, REPO, STAGE_SHARE, STAGES, _Shares, _Tail
from rota.bench.fault_harness import Harness, port_open
from rota.client import Client

SLOW_RANK = 1
FACTOR = 1.5
LAYERS = "4,4,4,4"
JOB_ARGS = ("--width", "128", "--heads", "4", "--tokens", "512", "--microbatches", "4", "--layers-per-stage", LAYERS)
WARMUP = 30  # the cluster's detector learns the job on its first 30 iterations (ROTA_DETECTOR_WARMUP)
THROTTLE_AT = 40
BEFORE = (8, 38)  # after the first steps' start-up, before the throttle
SETTLE = 4  # iterations after a change (the throttle, the restart) before a rate counts
SLOW_AT_LEAST = 30  # iterations run slow before the re-plan (the "while slow" rate spans them)
AFTER = 30
ITERATIONS = 1000  # more than a run needs: it is cancelled once the "after" rate is measured
RUN_LIMIT_S = 420.0
HEARTBEAT_S = 3.0  # the cluster's heartbeat interval for these runs (see `local_cluster`)


@dataclass
class LiveRun:
    """What one live run saw: the job's log, the verdicts, the re-plan's answer, the rates."""

    job_id: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)  # the job's log lines, in order
    throttled_from: int | None = None
    verdict: dict[str, Any] | None = None
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    replan: dict[str, Any] | None = None
    replan_s: float = 0.0  # from the replan call to the restarted job's first step
    load: list[float] = field(default_factory=list)  # 1-minute load average, sampled through the run

    def segments(self) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """(start line, its steps) per start of the job."""
        out: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        for line in self.steps:
            if "start" in line:
                out.append((line, []))
            elif out:
                out[-1][1].append(line)
        return out


def rate(steps: list[dict[str, Any]], first: int, last: int) -> float | None:
    """Iterations per second from the job's stamps of steps `first` to `last` (None: not both seen)."""
    at = {int(s["step"]): float(s["t"]) for s in steps}
    if first not in at or last not in at or last <= first:
        return None
    return (last - first) / (at[last] - at[first])


def busy_share(steps: list[dict[str, Any]], first: int, last: int) -> list[float]:
    """Each stage's median busy time over steps [first, last], seconds."""
    rows = [s["busy"] for s in steps if first <= int(s["step"]) <= last]
    return [round(statistics.median(r[k] for r in rows), 4) for k in range(STAGES)] if rows else []


def summary(run: LiveRun) -> dict[str, Any]:
    """The three rates, the recovered share and what the restart loaded."""
    segs = run.segments()
    out: dict[str, Any] = {"job_id": run.job_id, "verdict": run.verdict, "throttled_from": run.throttled_from,
                           "load": [min(run.load, default=0.0), max(run.load, default=0.0)]}
    if not segs or run.throttled_from is None:
        return out
    first, steps = segs[0]
    slow_from = run.throttled_from + SETTLE
    slow_to = int(steps[-1]["step"]) if steps else slow_from
    out |= {"before_it_s": rate(steps, *BEFORE), "slow_it_s": rate(steps, slow_from, slow_to),
            "windows": {"before": list(BEFORE), "slow": [slow_from, slow_to]},
            "busy_s": {"before": busy_share(steps, *BEFORE), "slow": busy_share(steps, slow_from, slow_to)},
            "layers_before": first["layers"]}
    if len(segs) > 1:
        again, after = segs[1]
        a0 = int(again["start"]) + SETTLE
        out |= {"restart_step": again["start"], "layers_after": again["layers"], "after_it_s": rate(after, a0, a0 + AFTER),
                "replan_s": round(run.replan_s, 1)}
        out["windows"]["after"] = [a0, a0 + AFTER]
        out["busy_s"]["after"] = busy_share(after, a0, a0 + AFTER)
        last_loss = [float(s["loss"]) for s in after[-10:]]
        out["loss"] = {"first": [round(float(s["loss"]), 3) for s in steps[:5]],
                       "before_pause": [round(float(s["loss"]), 3) for s in steps[-5:]],
                       "after_restart": [round(float(s["loss"]), 3) for s in after[:5]],
                       "last": round(statistics.mean(last_loss), 3) if last_loss else None}
    b, s, a = out.get("before_it_s"), out.get("slow_it_s"), out.get("after_it_s")
    if b and s and a and b > s:
        out["recovered_share"] = round((a - s) / (b - s), 3)
    return out


class Cluster(Harness):
    """A running local cluster (the fault suite's `Harness`: `rota up`, the SDK client),
    driven by the `rota` CLI."""

    def env(self) -> dict[str, str]:
        return {**{k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}, "ROTA_HOME": str(self.home)}

    def cli(self, *args: str) -> Any:
        argv = [sys.executable, "-m", "rota.cli.main", *args, "--json"]
        done = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"rota {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
        return json.loads(done.stdout)


@contextmanager
def local_cluster(work: Path, log: Callable[[str], None]) -> Iterator[Cluster]:
    """`rota up` (2 nodes of 4 GPUs, one allocator, the detector's warm-up `WARMUP`, tenant
    demo) on a database of its own; stopped, and the database dropped, after."""
    # Heartbeats every `HEARTBEAT_S` (a rank or node is silent after three): restored stages
    # under their caps, on two cores other work shares, went 6 s without a beat while they
    # pooled their parts (and the 1 s default's 3 s timeout failed the job).
    env = {"ROTA_SCHEDULE_INTERVAL": "0.3", "ROTA_DETECTOR_WARMUP": str(WARMUP)}
    # The detector's rule is the caller's to choose (ROTA_DETECTOR_MODE=cusum with
    # ROTA_DETECTOR_COMMON_MODE=1 runs the sequential test the replayed runs score best).
    env |= {k: os.environ[k] for k in ("ROTA_DETECTOR_MODE", "ROTA_DETECTOR_COMMON_MODE") if k in os.environ}
    # The machine's PostgreSQL and Redis when they answer, else embedded ones; the cluster
    # reaches its database directly and runs `rota up`'s own timers but for those above.
    cluster = Cluster(work / "home", redis_url="redis://127.0.0.1:6379/0" if port_open(6379) else "", nodes=2,
                      gpus_per_node=4, allocators=1, proxy_postgres=False, fast_timers=False, extra_env=env,
                      heartbeat_interval_s=HEARTBEAT_S, own_database=f"rota_live_replan_{os.getpid()}",
                      tenants=("demo",))
    try:
        cluster.start()
        log(f"cluster up at {cluster.home}")
        yield cluster
    finally:
        cluster.stop()


def job_file(work: Path, iterations: int = ITERATIONS) -> Path:
    command = [sys.executable, str(JOB), "--iterations", str(iterations), "--checkpoint", "--log", str(work / "steps.jsonl"),
               "--pid-dir", str(work), "--beat", "0.5", *JOB_ARGS]
    spec = {"name": "pipeline-failslow-live", "tenant": "demo", "kind": "training", "gpus": STAGES, "command": command,
            "workdir": str(REPO), "restart": "never", "accepts_layout_changes": True, "duration": "10m"}
    path = work / "job.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


@dataclass
class _Driver:
    """One run's state machine, stepped every 0.1 s: throttle at `THROTTLE_AT`, wait for the
    verdict on `SLOW_RANK`, re-plan (the CLI, in the background: the checkpoint waits for
    the job's next step), done once the restarted job has run its "after" window."""

    cluster: Cluster
    work: Path
    log: Callable[[str], None]
    run: LiveRun
    shares: _Shares
    tail: _Tail
    replanning: subprocess.Popen[str] | None = None
    replan_started: float = 0.0
    next_poll: float = 0.0

    def step(self, client: Client) -> bool:
        """One look; True when the run is done."""
        run = self.run
        self.shares.ensure()
        for line in self.tail.read():
            run.steps.append(line)
            if "start" in line:
                self.log(f"job started at step {line['start']} with layers {line['layers']}")
                if self.replanning is not None:
                    run.replan_s = time.monotonic() - self.replan_started
        segs = run.segments()
        step = int(segs[-1][1][-1]["step"]) if segs and segs[-1][1] else -1
        if run.throttled_from is None and step >= THROTTLE_AT - 1:
            self.shares.slow(SLOW_RANK, FACTOR)
            run.throttled_from = step + 1
            self.log(f"rank {SLOW_RANK} throttled {FACTOR}x from iteration {step + 1}")
        if time.monotonic() >= self.next_poll:
            self.poll(client)
        if self.replanning is None and run.verdict is not None and step >= (run.throttled_from or 0) + SLOW_AT_LEAST:
            self.start_replan(step)
        if self.replanning is not None and run.replan is None and self.replanning.poll() is not None:
            out, err = self.replanning.communicate()
            if self.replanning.returncode != 0:
                raise RuntimeError(f"rota replan --apply failed ({self.replanning.returncode}): {err[-2000:]}")
            run.replan = json.loads(out)
            self.log(f"re-plan applied at step {run.replan['step']}: layers per stage {run.replan['layers_per_stage']}, "
                     f"stages {[(st['ranks'], st['layers']) for st in run.replan['stages']]}")
        return len(segs) > 1 and step >= int(segs[-1][0]["start"]) + SETTLE + AFTER

    def poll(self, client: Client) -> None:
        """Every 2 s: the load, the job's state and (until found) its verdicts."""
        run = self.run
        self.next_poll = time.monotonic() + 2.0
        run.load.append(os.getloadavg()[0])
        job = client.get_job(run.job_id)
        if job.state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            raise RuntimeError(f"the job ended early: {job.state} ({job.reason})")
        if run.verdict is None:
            run.verdicts = [v.to_dict() for v in client.verdicts(job_id=run.job_id)]
            mine = [v for v in run.verdicts if v["kind"] == "slow" and v["rank"] == SLOW_RANK]
            if mine:
                first = min(mine, key=lambda v: int(v["iteration"]))
                run.verdict = {k: first[k] for k in ("rank", "ratio", "iteration")}
                others = [(v["rank"], v["kind"], v["iteration"]) for v in run.verdicts if v is not first]
                self.log(f"verdict: rank {SLOW_RANK} slow x{first['ratio']:.2f} at iteration {first['iteration']}"
                         + (f"; also {others}" if others else ""))

    def start_replan(self, step: int) -> None:
        argv = [sys.executable, "-m", "rota.cli.main", "replan", self.run.job_id, "--apply", "--wait", "120",
                "--layers", str(sum(int(n) for n in LAYERS.split(","))), "--json"]
        self.replanning = subprocess.Popen(argv, cwd=REPO, env=self.cluster.env(), stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
        self.replan_started = time.monotonic()
        self.log(f"rota replan {self.run.job_id} --apply --layers 16, at iteration {step}")


def drive(cluster: Cluster, work: Path, log: Callable[[str], None], name: str = "live") -> LiveRun:
    """One run on `cluster` (see the module doc): submit, throttle, wait for the verdict,
    re-plan with --apply, measure; the job cancelled and every cgroup removed at the end."""
    run = LiveRun()
    run.job_id = cluster.cli("submit", str(job_file(work)))["id"]
    log(f"submitted {run.job_id}")
    driver = _Driver(cluster, work, log, run, _Shares(work, f"{os.getpid()}-{name}", STAGE_SHARE),
                     _Tail(work / "steps.jsonl"))
    deadline = time.monotonic() + RUN_LIMIT_S
    try:
        with cluster.client() as client:
            while not driver.step(client):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the live run passed {RUN_LIMIT_S:g} s")
                time.sleep(0.1)
        return run
    finally:
        try:
            with cluster.client() as client:
                client.cancel(run.job_id, reason="live re-plan run done")
        except Exception as exc:  # noqa: BLE001 - cleanup goes on; the cluster's stop ends the job anyway
            log(f"cancel: {exc}")
        if driver.replanning is not None and driver.replanning.poll() is None:
            driver.replanning.kill()
            driver.replanning.wait()
        _end_stages(work)
        driver.shares.close()
        (work / "run.json").write_text(json.dumps({"steps": run.steps, "verdicts": run.verdicts, "replan": run.replan,
                                                   "throttled_from": run.throttled_from, "load": run.load}))


def _end_stages(work: Path) -> None:
    """Waits for the job's stage processes (named by their pid files) to end after the
    cancel; kills any still there after 20 s."""
    pids = []
    for rank in range(STAGES):
        try:
            pids.append(int((work / f"rank{rank}.pid").read_text()))
        except (OSError, ValueError):
            continue
    until = time.monotonic() + 20
    while time.monotonic() < until and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_live(log: Callable[[str], None], runs: int = 1, keep: Path | None = None) -> dict[str, Any]:
    """`runs` live runs on one fresh local cluster, one after another; their summaries and
    the medians of the rates. With `keep`, the cluster's folder (its logs, the job's output)
    and each run's record stay there."""
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rota-live-replan-") as tmp:
        base = Path(tmp) if keep is None else keep
        base.mkdir(parents=True, exist_ok=True)
        with local_cluster(base, log) as cluster:
            for i in range(runs):
                work = base / f"run{i}"
                work.mkdir(exist_ok=True)
                run = drive(cluster, work, log, name=f"run{i}")
                out.append(summary(run))
                log(json.dumps(out[-1]))
                if keep is not None:
                    (keep / f"live-run{i}.json").write_text(json.dumps({"summary": out[-1], "steps": run.steps,
                                                                         "verdicts": run.verdicts, "replan": run.replan}))
    rates = {k: [r[k] for r in out if r.get(k)] for k in ("before_it_s", "slow_it_s", "after_it_s")}
    med = {k: round(statistics.median(v), 3) if v else None for k, v in rates.items()}
    b, s, a = med["before_it_s"], med["slow_it_s"], med["after_it_s"]
    share = round((a - s) / (b - s), 3) if b and s and a and b > s else None
    return {"runs": out, **med, "recovered_share": share}


def print_live(live: dict[str, Any]) -> None:
    print(f"live re-plan: rank {SLOW_RANK} throttled {FACTOR}x on a local cluster, `rota replan --apply` once flagged")
    print(f"{'run':>3} {'verdict':>16} {'layers after':>13} {'before':>7} {'slow':>7} {'after':>7} {'recovered':>9} load")
    for i, r in enumerate(live["runs"]):
        v = r.get("verdict") or {}
        verdict = f"x{v['ratio']:.2f} at {v['iteration']}" if v else "-"
        cells = [f"{r[k]:.3f}" if r.get(k) else "-" for k in ("before_it_s", "slow_it_s", "after_it_s")]
        share = f"{r['recovered_share']:.2f}" if r.get("recovered_share") is not None else "-"
        print(f"{i:>3} {verdict:>16} {str(r.get('layers_after', '-')):>13} {cells[0]:>7} {cells[1]:>7} {cells[2]:>7} "
              f"{share:>9} {r['load'][0]:.1f}-{r['load'][1]:.1f}")
    print(f"medians: {live['before_it_s']} it/s before, {live['slow_it_s']} while slow, {live['after_it_s']} after; "
          f"recovered {live['recovered_share']} of the loss")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="the applied re-plan on the real pipeline job, on a local cluster")
    parser.add_argument("--runs", type=int, default=1, help="live runs, one after another on one cluster")
    parser.add_argument("--save", type=Path, help="keep the cluster's folder and each run's record here")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs: at least 1 (got {args.runs})")

    def log(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)

    # A TERM (a `timeout` around the run) unwinds like an error: the cgroups go, the job and cluster stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    live = run_live(log, args.runs, args.save)
    if args.json:
        print(json.dumps(live))
    else:
        print_live(live)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
