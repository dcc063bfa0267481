"""The handlers of the commands that run Rota's processes (rota.cli.registry names them)."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rota.cli.commands import gpu_count, home_of, where_text
from rota.cli.node_layout import node_layout
from rota.cli.output import LiveScreen, progress_text, shorten, table, ticks
from rota.cli.running import CLUSTER_MODULES, import_server, require_server
from rota.client import Client, Job, JobState, job_spec_from_mapping, load_job_file

DEMO_JOBS = ("train-small.yaml", "train-2gpu.yaml", "batch-infer.yaml", "quantize-lite.yaml", "fail.yaml")


# Cluster lifecycle.
def up(args: argparse.Namespace) -> int:
    require_server("up", CLUSTER_MODULES)
    layout = node_layout(args.nodes, args.gpu_types, args.topology)
    if layout.count < 1 or args.gpus_per_node < 1 or args.allocators < 1 or args.api_workers < 1:
        raise ValueError("--nodes, --gpus-per-node, --allocators and --api-workers must be at least 1")
    if not 0 <= args.console_port <= 65535:
        raise ValueError(f"--console-port: a port from 1 to 65535, or 0 for a free one (got {args.console_port})")
    from rota.operator.localcluster import LocalCluster, run_up  # the cluster's machinery: only for `up`

    cluster = LocalCluster(
        home=Path(args.home), nodes=layout.count, gpus_per_node=args.gpus_per_node,
        database_url=args.database_url, redis_url=args.redis_url, tracing=args.tracing,
        heartbeat_interval_s=args.heartbeat_interval, allocators=args.allocators, tls=args.tls,
        api_workers=args.api_workers, gpu_types=layout.gpu_types, switches=layout.switches,
        console_port=args.console_port,
    )
    return run_up(cluster)


def down(args: argparse.Namespace) -> int:
    home = home_of(args)
    if home is None:
        raise ValueError("--home: which cluster? (or set ROTA_HOME)")
    from rota.operator.localcluster import run_down

    run_down(home)
    print(f"cluster under {home} stopped")
    return 0


# Processes of a deployment.
def serve(args: argparse.Namespace) -> int:
    import_server(f"serve {args.service}", f"rota.{args.service}.main").main()
    return 0


def agent(args: argparse.Namespace) -> int:
    """`rota agent`: ARGS were parsed by the agent's own parser (rota.cli.main)."""
    import_server("agent", "rota.agent.main").run(args)
    return 0


def db_migrate(args: argparse.Namespace) -> int:
    """`rota db migrate`: the database's schema up to date (or down to --downgrade)."""
    migrations = import_server("db migrate", "rota.common.migrate")
    if not args.database_url:
        raise ValueError("--database-url: required (or set ROTA_DATABASE_URL)")
    if args.downgrade:
        migrations.downgrade(args.database_url, args.downgrade)
    else:
        migrations.upgrade(args.database_url)
    return 0


# The demo.
def demo(args: argparse.Namespace) -> int:
    require_server("demo", (*CLUSTER_MODULES, "torch"))  # the example jobs train with torch
    examples = Path(__file__).resolve().parents[3] / "examples"
    if not examples.is_dir():
        examples = Path.cwd() / "examples"
    files = [examples / name for name in DEMO_JOBS if (examples / name).exists()]
    if not files:
        raise FileNotFoundError(f"no example job files in {examples}")
    from rota.operator.localcluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="rota-demo-") as tmp:
        home = Path(args.home) if args.home else Path(tmp)
        cluster = LocalCluster(home=home, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                               database_url=args.database_url, redis_url=args.redis_url)
        print(f"starting a local cluster: {args.nodes} nodes x {args.gpus_per_node} virtual GPUs under {home} ...", flush=True)
        try:
            cluster.start()
            with Client.from_home(home) as client:
                if "demo" not in {t.name for t in client.list_tenants()}:
                    client.create_tenant("demo", share=1.0)
                ids = []
                for file in files:
                    # The examples name no tenant (a tenant's token decides); the admin's names demo.
                    spec = job_spec_from_mapping({"tenant": "demo", **load_job_file(file)}, base_dir=examples.parent)
                    ids.append(client.submit(spec=spec).id)
                    print(f"submitted {file.name}", flush=True)
                return _demo_table(client, ids, args.timeout)
        finally:
            print("stopping the cluster ...", flush=True)
            cluster.stop()


DEMO_WHY_WIDTH = 60


def demo_table(found: Sequence[Job]) -> str:
    rows = [(j.id, j.name, j.kind, gpu_count(j), j.state, where_text(j),
             progress_text(j.progress), shorten(j.reason, DEMO_WHY_WIDTH)) for j in found]
    return table(("ID", "NAME", "KIND", "GPUS", "STATE", "PLACEMENT", "PROGRESS", "WHY"), rows)


def _demo_table(client: Client, ids: list[str], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    screen = LiveScreen()
    for _ in ticks(0.5):
        found = [client.get_job(i) for i in ids]
        screen.show(demo_table(found), only_changed=True)
        if all(j.finished for j in found):
            done = sum(j.state == JobState.SUCCEEDED for j in found)
            print(f"\nall {len(found)} jobs finished: {done} succeeded, "
                  f"{sum(j.state == JobState.FAILED for j in found)} failed (fail.yaml fails on purpose)")
            expected_fail = {j.id for j in found if j.name.startswith("fail")}
            ok = all(j.state == JobState.SUCCEEDED or j.id in expected_fail for j in found)
            return 0 if ok else 1
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo jobs did not finish within {timeout_s:.0f}s")
    raise AssertionError("ticks() without a count does not end")
