"""Handlers of the `rota` subcommands. Cluster calls go through `rota.client.Client`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from rota.cli import http_submit
from rota.cli.flags import job_states
from rota.cli.output import LiveScreen, ago, print_json, progress_text, table, ticks
from rota.cli.running import import_server, require_server
from rota.client import (
    Client,
    DeadlineExceededError,
    Job,
    JobSpec,
    JobState,
    NotFoundError,
    RotaError,
    UnavailableError,
    UnimplementedError,
    parse_duration,
)
from rota.client.client import iso_utc

if TYPE_CHECKING:  # loaded by the SDK when `rota job` asks for them, not by every command
    from rota.client import Explanation, Tenant, Verdict

# Connection.
def home_of(args: argparse.Namespace) -> Path | None:
    from rota.client.home import home_path

    return home_path(getattr(args, "home", None))


def connect(args: argparse.Namespace) -> Client:
    # --endpoint / --token / --home, else ROTA_ENDPOINT / ROTA_TOKEN / ROTA_HOME; mutual TLS
    # from ROTA_TLS_CA/CERT/KEY, else the client certificate `rota up --tls` recorded.
    return Client.from_env(endpoint=args.endpoint, token=args.token, home=getattr(args, "home", None),
                           timeout=timedelta(seconds=30))


# Jobs.
SUBMIT_CONCURRENCY = 16  # calls in flight on the one channel: the api commits them as one batch


def submit(args: argparse.Namespace) -> int:
    specs = http_submit.specs_of(args)
    from rota.cli import array_commands  # --array (the Slurm habits)

    indices = array_commands.array_text(args)
    if indices is not None:
        return array_commands.submit_array(args, specs[0], indices, connect)
    if len(specs) > 1:
        return _submit_many(args, specs)
    spec = specs[0]
    if args.what_if:
        with connect(args) as client:
            answer = client.what_if(spec=spec)
        if args.json:
            print_json(asdict(answer))
        else:
            print(answer.text())
        return 0
    with connect(args) as client:
        job = client.submit(spec=spec, request_id=args.request_id)
        if args.wait:
            job = client.wait(job.id)
    if not args.wait:
        http_submit.print_submitted(args, job.id, job.name, job.state)
        return 0
    if args.json:
        print_json(job.to_dict())
    else:
        print(f"{job.id} {job.state}")
    return 0 if job.state == JobState.SUCCEEDED else 1


def _submit_many(args: argparse.Namespace, specs: list[JobSpec]) -> int:
    """Several files over one channel, SUBMIT_CONCURRENCY at a time, so the api's batcher
    commits them together (one fsync for the lot, not one per file). Each is a submission
    of its own, as a loop of `sbatch` is: one the api refuses stops none of the others, and
    the exit status is 1 when any was refused (each refusal names its file)."""
    for flag, given in (("--what-if", args.what_if), ("--wait", args.wait), ("--request-id", args.request_id)):
        if given:
            raise ValueError(f"{flag}: one FILE at a time (got {len(specs)})")
    from concurrent.futures import ThreadPoolExecutor

    def send(spec: JobSpec) -> Job | RotaError:
        try:
            return client.submit(spec=spec)
        except RotaError as exc:
            return exc

    with connect(args) as client, ThreadPoolExecutor(max_workers=min(SUBMIT_CONCURRENCY, len(specs))) as pool:
        answers = list(pool.map(send, specs))
    return http_submit.print_rows(args, [(a.id, a.state) if isinstance(a, Job) else a for a in answers])


def jobs(args: argparse.Namespace) -> int:
    args.state = job_states(args.state)  # a typo fails here, naming --state and the states
    if getattr(args, "watch", False):
        return _watch_jobs(args)
    with connect(args) as client:
        if args.json:  # every task as a job of its own (with `array` and `array_index`)
            found = client.list_jobs(tenant=args.tenant, states=args.state, limit=args.limit, **_mine(args))
            print_json([j.to_dict() for j in found])
            return 0
        print(_jobs_text(client, args)[1])
    return 0


def _jobs_text(client: Client, args: argparse.Namespace) -> tuple[int, str]:
    """The filtered jobs (how many) and their table, an array's tasks folded into one row
    unless --expand: what `rota jobs` prints and `rota jobs --watch` redraws."""
    found, arrays = client.list_jobs_and_arrays(tenant=args.tenant, states=args.state, limit=args.limit,
                                                **_mine(args))
    if getattr(args, "expand", False):
        return len(found), jobs_table(found)
    from rota.cli.array_commands import grouped_table

    return len(found), grouped_table(found, arrays, jobs_table)


def _mine(args: argparse.Namespace) -> dict[str, bool]:
    """`--mine`: only the jobs the caller's user token submitted."""
    return {"mine": True} if getattr(args, "mine", False) else {}


def jobs_table(found: Sequence[Job]) -> str:
    rows = [
        (j.id, j.name, j.tenant, j.user or "-", j.kind, j.priority, gpu_count(j), j.state,
         where_text(j), progress_text(j.progress), ago(j.created_at))
        for j in found
    ]
    return table(("ID", "NAME", "TENANT", "USER", "KIND", "PRIO", "GPUS", "STATE", "PLACEMENT", "PROGRESS", "SUBMITTED"),
                 rows)


def gpu_count(job: Job) -> int:
    """The GPUS column: how many GPUs the job holds where it is placed (a gang's on every node,
    a realtime app's over all its replicas), else how many it asks for (0 for another
    tenant's job, whose spec is not shown)."""
    if job.node:
        if job.replicas:
            return sum(len(gpus) for gpus in job.replicas.values())
        return len(job.gpus) * max(1, len(job.nodes))
    return job.spec.gpus if job.spec.command else 0


def _watch_jobs(args: argparse.Namespace, screen: LiveScreen | None = None,
                clock: Callable[[], float] | None = None, sleep: Callable[[float], None] | None = None) -> int:
    """`rota jobs --watch`: the filtered table every --interval seconds until Ctrl-C (or
    --count frames); with --json one JSON array per line per refresh. `screen`, `clock`
    and `sleep` are the terminal's and the time's unless a test gives its own."""
    if not args.interval > 0:
        raise ValueError(f"--interval: must be a positive number of seconds (got {args.interval:g})")
    if args.count < 0:
        raise ValueError(f"--count: must be 0 (until Ctrl-C) or more (got {args.count})")
    screen = screen or LiveScreen()
    try:
        with connect(args) as client:
            for _ in ticks(args.interval, args.count, clock=clock or time.monotonic, sleep=sleep or time.sleep):
                if args.json:
                    found = client.list_jobs(tenant=args.tenant, states=args.state, limit=args.limit)
                    print(json.dumps([j.to_dict() for j in found], default=str), flush=True)
                    continue
                shown, table_text = _jobs_text(client, args)
                at = iso_utc(datetime.now(UTC), "seconds")
                screen.show(f"jobs at {at}: {shown} shown, every {args.interval:g}s (Ctrl-C stops)\n" + table_text)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends
    return 0


def _print_job(job: Job) -> None:
    print(f"{job.id}  {job.name}  ({job.kind}, tenant {job.tenant}, priority {job.priority})")
    print(f"  state:    {job.state} — {job.reason}")
    print(f"  command:  {' '.join(job.spec.command)}")
    print(f"  gpus:     {job.spec.gpus} requested; placed on {where_text(job)} (epoch {job.epoch})")
    if job.guests:
        print(f"  guests:   {', '.join(job.guests)} (trials in its bubbles)")
    if limits := limits_text(job):
        print(f"  limits:   {limits}")
    # A job cancelled before it ran has no exit code (the wire's 0 would read as a success).
    ran = job.finished and job.started_at is not None
    print(f"  attempts: {job.attempts}   exit code: {job.exit_code if ran else '-'}")
    if job.progress:
        print(f"  progress: {progress_text(job.progress)}")
    if job.error:
        print("  error:    " + job.error.strip().replace("\n", "\n            "))
    print("  history:")
    for change in job.history:
        when = iso_utc(change.at, "seconds") or "-"  # UTC with `Z`, as in --json
        print(f"    {when}  {change.from_state:>9} -> {change.to_state:<9} {change.reason}")


def limits_text(job: Job) -> str:
    """`cpus 2, memory 4Gi, time limit 0:10:00` (what the job asked for; "" when nothing)."""
    spec = job.spec
    parts = [f"cpus {spec.cpus:g}" if spec.cpus is not None else "", f"memory {spec.memory}" if spec.memory else "",
             f"time limit {spec.time_limit}" if spec.time_limit is not None else ""]
    return ", ".join(p for p in parts if p)


def job(args: argparse.Namespace) -> int:
    with connect(args) as client:
        try:
            found = client.get_job(args.id)
        except NotFoundError:
            from rota.cli.array_commands import show_array  # `rota job ARRAY`, as `squeue -j` takes one

            return show_array(args, client, args.id)
        explained = _explanation(client, args.id)
        verdicts = _verdicts(client, args.id)
    if args.json:
        out = found.to_dict()
        if explained is not None:
            out["duration"] = {k: v for k, v in asdict(explained).items() if k not in ("job_id", "reason")}
        if verdicts is not None:
            out["verdicts"] = [v.to_dict() for v in verdicts]
        print_json(out)
    else:
        _print_job(found)
        if explained is not None and explained.model:
            print(f"  duration: {explained.duration_text()}")
        for i, v in enumerate(verdicts or []):
            print(("  verdicts: " if i == 0 else "            ") + v.summary())
    return 0


def _explanation(client: Client, job_id: str) -> Explanation | None:
    """The allocator's view of the job; a job still shows when the allocator is unreachable."""
    try:
        return client.explain(job_id)
    except (UnavailableError, UnimplementedError, DeadlineExceededError):
        return None


def _verdicts(client: Client, job_id: str) -> list[Verdict] | None:
    """The failure detector's verdicts on the job; a job still shows when the detector is unreachable."""
    try:
        return client.verdicts(job_id=job_id)
    except (UnavailableError, UnimplementedError, DeadlineExceededError):
        return None


def logs(args: argparse.Namespace) -> int:
    with connect(args) as client:
        for chunk in client.log_chunks(args.id, follow=args.follow):  # the bytes as the job wrote them
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    return 0


def cancel(args: argparse.Namespace) -> int:
    from rota.cli import array_commands  # a job, or every task of an array

    return array_commands.cancel(args, connect)


def watch(args: argparse.Namespace) -> int:
    with connect(args) as client:
        for event in client.watch(args.id):
            j = event.job
            if args.json:
                print_json({"event": event.event, "job": j.to_dict()})
            else:
                print(f"{time.strftime('%H:%M:%S')}  {j.id}  {j.state:<9} {progress_text(j.progress)}  {j.reason}", flush=True)
    return 0


def explain(args: argparse.Namespace) -> int:
    with connect(args) as client:
        try:
            found = client.get_job(args.id)
        except NotFoundError:
            return _explain_array(args, client)  # NOT_FOUND again for neither a job nor an array
        explained = _explanation(client, args.id)
    if args.json:
        print_json({"id": found.id, "state": found.state, "reason": found.reason,
                    **({"duration": asdict(explained)} if explained else {})})
    else:
        print(f"{found.id} {found.state}: {found.reason}")
        if explained is not None and explained.model:
            print(f"duration: {explained.duration_text()}")
    return 0


def _explain_array(args: argparse.Namespace, client: Client) -> int:
    """`rota explain ARRAY`: its tasks counted, and why the waiting ones wait (the %K cap,
    a dependency, or the first waiting task's own explanation), as the allocator says."""
    explained = client.explain(args.id)
    if args.json:
        print_json({"id": explained.job_id, "array": True, "explanation": explained.reason.splitlines()})
    else:
        print(explained.reason)
    return 0


def nodes(args: argparse.Namespace) -> int:
    with connect(args) as client:
        found = client.nodes()
    if args.json:
        print_json([n.to_dict() for n in found])
        return 0
    rows = [
        (n.name, n.health, n.address, len(n.gpus), ",".join(n.gpu_types) or "-", n.switch or "-",
         sum(1 for g in n.gpus if g.job_id), " ".join(f"{g.index}:{g.job_id or '-'}" for g in n.gpus),
         ago(n.last_heartbeat))
        for n in found
    ]
    print(table(("NODE", "HEALTH", "ADDRESS", "GPUS", "TYPE", "SWITCH", "BUSY", "GPU:JOB", "HEARTBEAT"), rows))
    return 0


def tenants(args: argparse.Namespace) -> int:
    from rota.cli import user_commands as quotas  # the quota flags and table

    with connect(args) as client:
        if args.tenants_command in ("add", "token"):
            ttl_text = args.token_ttl if args.tenants_command == "add" else args.ttl
            flag = "--token-ttl" if args.tenants_command == "add" else "--ttl"
            ttl = timedelta(seconds=parse_duration(ttl_text, flag)) if ttl_text else None
            if args.tenants_command == "add":
                tenant, token = client.create_tenant(
                    args.name, share=args.share, token_ttl=ttl, guaranteed=args.guaranteed, limit=args.limit,
                    gpu_limits=quotas.gpu_limits(args.gpu_limit), parent=args.parent)
                done = f"tenant {tenant.name} (share {tenant.share:g}{_quota_text(tenant)}) created"
            else:
                tenant, token = client.issue_token(args.name, ttl=ttl)
                done = f"tenant {tenant.name} has a new token; the old one no longer works"
            expires = _expiry_text(tenant.token_expires_at)
            if args.json:
                print_json({**quotas.tenant_row(tenant), "token": token})
            else:
                print(f"{done}; its token (shown once, {expires}):\n{token}")
            return 0
        found = client.list_tenants()
    if args.json:
        print_json([quotas.tenant_row(t) for t in found])
    else:
        print(quotas.tenants_table(found))
    return 0


def _quota_text(tenant: Tenant) -> str:
    limit = "no limit" if tenant.limit is None else f"limit {tenant.limit}"
    return f", guaranteed {tenant.guaranteed}, {limit}"


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.replace(tzinfo=UTC).isoformat(timespec="seconds")


def _expiry_text(at: datetime | None) -> str:
    return "does not expire" if at is None else f"expires {_iso(at)}"


def bench(args: argparse.Namespace) -> int:
    targets = {
        "allocator": "rota.bench.allocator", "forecaster": "rota.bench.forecaster", "faults": "rota.bench.faults",
        "load": "rota.bench.load", "detector": "rota.bench.detector",
        "checkpoint": "rota.bench.checkpoint", "moves": "rota.bench.moves",
        "concur": "rota.bench.concur", "hydro": "rota.bench.hydro", "overlap": "rota.bench.overlap",
        "shares": "rota.bench.shares", "slurm": "rota.bench.slurm",
    }
    if args.target not in targets:
        raise ValueError(f"bench: unknown target {args.target!r}; one of {', '.join(targets)}")
    return int(import_server("bench", targets[args.target]).main(list(args.args)))


def sim(args: argparse.Namespace) -> int:
    # The simulator itself is pure Python; its pictures are not (checked before it runs).
    if any(a == "--render" or a.startswith("--render=") for a in args.args):
        require_server("sim --render", ("numpy", "matplotlib"))
    return int(import_server("sim", "rota.sim.cli").main(list(args.args)))


def tune(args: argparse.Namespace) -> int:
    # Optuna and torch: the server extra's (the study trains the job file's model here).
    require_server("tune", ("optuna", "torch"))
    return int(import_server("tune", "rota.jobkit.tuning.cli").main(list(args.args)))


def where_text(job: Job) -> str:
    """Where it runs: `node [gpus]`, for a gang `node-a,node-b x [gpus]`, for a realtime app on
    several nodes `node-a [0, 1] node-b [1]`; `-` if nowhere."""
    if not job.node:
        return "-"
    if job.nodes:
        return f"{','.join(job.nodes)} x {job.gpus}"
    if len(job.replicas) > 1:
        return " ".join(f"{node} {gpus}" for node, gpus in job.replicas.items())
    if job.guest_of:
        return f"{job.node} {job.gpus} in {job.guest_of}'s bubbles"
    return f"{job.node} {job.gpus}"
