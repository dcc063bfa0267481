"""The `rota` command. Cluster commands go through the SDK (`rota.client`).

Human-readable output by default, `--json` for scripts; any error exits non-zero with one
line on stderr naming the field or the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

# platformdirs (pulled in by the embedded servers) warns on machines without a login session.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from rota.cli.components import CONSOLE, SERVICES  # noqa: E402

Handler = Callable[[argparse.Namespace], int]
# The commands scripts call in loops (`for f in *.yaml; do rota submit $f; done`): parsed
# with only their own subcommand, so a call imports the SDK and its one handler module, not
# every command's (the others bring the local cluster, certificates, plots).
SCRIPTED = ("submit", "jobs", "job", "logs", "cancel", "watch", "nodes", "explain")
# Filled by build_parser(): each subcommand's handler (the command modules add theirs).
HANDLERS: dict[str, Handler] = {}


class _Parser(argparse.ArgumentParser):
    """The CLI's parsers. One made with `service=MODULE` (`rota agent`) takes its flags, help
    included, from that module's own `build_parser()`, imported by name when the subcommand is
    parsed: building the CLI (`rota --help`, any client command) imports no service."""

    def __init__(self, *args: Any, service: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.service = service

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        if not self.service:
            return super().parse_known_args(args, namespace)
        from rota.cli.running import import_server

        own = import_server(self.prog.removeprefix("rota "), self.service).build_parser()
        return own.parse_args(args, namespace), []


def _connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", help="cluster folder written by `rota up` (default: $ROTA_HOME)")
    parser.add_argument("--endpoint", help="api address host:port (default: from the cluster folder)")
    parser.add_argument("--token", help="bearer token (default: $ROTA_TOKEN, else the admin token)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def build_parser(only: str = "") -> argparse.ArgumentParser:
    """The whole CLI (fills HANDLERS); with `only` one of SCRIPTED, that subcommand alone,
    built without importing any handler (`rota submit` over HTTP needs no gRPC client)."""
    parser = _Parser(prog="rota", description="Rota: a control plane for shared GPU clusters.")
    # Every subcommand's parser is a _Parser; the command modules take them as plain ArgumentParsers.
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser))
    if only in SCRIPTED:
        _scripted_parsers(sub, only)
        return parser
    from rota.cli import commands

    HANDLERS.update({name: getattr(commands, name) for name in SCRIPTED})
    HANDLERS.update({"up": commands.up, "down": commands.down, "demo": commands.demo, "tenants": commands.tenants,
                     "serve": commands.serve, "agent": commands.agent, "migrate": commands.migrate,
                     "bench": commands.bench, "sim": commands.sim, "tune": commands.tune})
    _lifecycle_parsers(sub)
    _scripted_parsers(sub)
    _other_parsers(sub)
    return parser


def _lifecycle_parsers(sub: Any) -> None:
    up = sub.add_parser("up", help="start a local cluster in the foreground")
    up.add_argument("--home", default=os.environ.get("ROTA_HOME", ".rota"), help="cluster folder (default: .rota)")
    up.add_argument("--nodes", type=int, default=None, help="virtual nodes (default: as many as --gpu-types or "
                    "--topology describe, else 2)")
    up.add_argument("--gpus-per-node", type=int, default=4)
    up.add_argument("--gpu-types", default="", metavar="TYPE:NODES,...",
                    help="the nodes' GPU types in node order, e.g. a100:2,h100:1 (node-1 and node-2 a100, node-3 h100)")
    up.add_argument("--topology", default="", metavar="SWITCH:NODES,...",
                    help="the nodes' network switches in node order, e.g. s1:2,s2:2 (their `switch` label)")
    up.add_argument("--database-url", default=os.environ.get("ROTA_DATABASE_URL", ""), help="default: embedded PostgreSQL")
    up.add_argument("--redis-url", default=os.environ.get("ROTA_REDIS_URL", ""), help="default: embedded Redis")
    up.add_argument("--tracing", default=os.environ.get("ROTA_TRACING", "none"), choices=("none", "console", "otlp"))
    up.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between agent heartbeats")
    up.add_argument("--allocators", type=int, default=1, help="allocator replicas (one leads, the others stand by)")
    up.add_argument("--tls", action="store_true", help="mutual TLS everywhere: a local CA and certificates under HOME/tls")
    up.add_argument("--api-workers", type=int, default=1,
                    help="api processes sharing the api port (SO_REUSEPORT); more serve more submissions per second")
    up.add_argument("--console-port", type=int, default=0, metavar="PORT",
                    help="the web console's HTTP port on 127.0.0.1 (default: a free one; printed, and in cluster.json)")

    down = sub.add_parser("down", help="stop the local cluster")
    down.add_argument("--home", help="cluster folder (default: $ROTA_HOME)")

    demo = sub.add_parser("demo", help="start a cluster, run the example jobs, show them live, stop")
    demo.add_argument("--home", default=None, help="cluster folder (default: a temporary one)")
    demo.add_argument("--nodes", type=int, default=2)
    demo.add_argument("--gpus-per-node", type=int, default=2)
    demo.add_argument("--database-url", default=os.environ.get("ROTA_DATABASE_URL", ""))
    demo.add_argument("--redis-url", default=os.environ.get("ROTA_REDIS_URL", ""))
    demo.add_argument("--timeout", type=float, default=600, help="give up after this many seconds")


def _scripted_parsers(sub: Any, only: str = "") -> None:
    def wanted(name: str) -> bool:
        return not only or name == only

    if wanted("submit"):
        _submit_parser(sub)
    if wanted("jobs"):
        _jobs_parser(sub)
    for name, what in (("job", "show one job with its history and progress"),
                       ("explain", "why a job waits or where it runs")):
        if wanted(name):
            one = sub.add_parser(name, help=what)
            one.add_argument("id")
            _connection_args(one)
    if wanted("logs"):
        logs = sub.add_parser("logs", help="print a job's log")
        logs.add_argument("id")
        logs.add_argument("-f", "--follow", action="store_true")
        _connection_args(logs)
    if wanted("cancel"):
        cancel = sub.add_parser("cancel", help="cancel a job")
        cancel.add_argument("id")
        cancel.add_argument("--reason", default="")
        _connection_args(cancel)
    if wanted("watch"):
        watch = sub.add_parser("watch", help="follow a job's events until it finishes")
        watch.add_argument("id")
        _connection_args(watch)
    if wanted("nodes"):
        _connection_args(sub.add_parser("nodes", help="list nodes with their GPUs and health"))


def _submit_parser(sub: Any) -> None:
    submit = sub.add_parser("submit", help="submit job files (YAML or JSON): one call, one connection")
    submit.add_argument("files", nargs="+", metavar="FILE", help="a job file; several are sent together")
    submit.add_argument("--tenant", help="override the file's tenant")
    submit.add_argument("--request-id", help="idempotency key (default: a new one)")
    submit.add_argument("--wait", action="store_true", help="wait until the job finishes")
    submit.add_argument("--what-if", action="store_true",
                        help="submit nothing: say when the allocator would start it if submitted now")
    submit.add_argument("--array", metavar="A-B[:STEP][%K]",
                        help="one job per index (0-99, 1,3,5-9), at most K running at once (over the file's array:)")
    submit.add_argument("--after", action="append", metavar="ID",
                        help="start only after job or array ID succeeded (repeatable)")
    _connection_args(submit)


def _jobs_parser(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--tenant", default="")
    jobs.add_argument("--state", action="append", default=[], help="filter by state (repeatable)")
    jobs.add_argument("--limit", type=int, default=0)
    jobs.add_argument("--watch", action="store_true",
                      help="a live table, redrawn every --interval seconds until Ctrl-C (with the same filters)")
    jobs.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="with --watch (default: 2)")
    jobs.add_argument("--count", type=int, default=0, metavar="N",
                      help="with --watch: stop after N refreshes (default: 0, until Ctrl-C)")
    jobs.add_argument("--expand", action="store_true", help="list each task of an array (default: one row per array)")
    _connection_args(jobs)


def _other_parsers(sub: Any) -> None:
    from rota.cli import (
        checkpoint_commands,
        deploy_commands,
        detector_commands,
        forecast_commands,
        ledger_commands,
        plan_commands,
    )

    HANDLERS.update({"plan": plan_commands.plan, **ledger_commands.HANDLERS})
    _connection_args(plan_commands.add_parser(sub))
    for ledger_parser in ledger_commands.add_parsers(sub):
        _connection_args(ledger_parser)
    forecast_commands.add_parsers(sub, _connection_args, HANDLERS)
    checkpoint_commands.add_parsers(sub, _connection_args, HANDLERS)
    detector_commands.add_parsers(sub, _connection_args, HANDLERS)
    deploy_commands.add_parsers(sub, HANDLERS)

    tenants = sub.add_parser("tenants", help="manage tenants")
    tsub = tenants.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    tadd = tsub.add_parser("add", help="create a tenant (admin) and print its token")
    tadd.add_argument("name")
    tadd.add_argument("--share", type=float, default=1.0)
    tadd.add_argument("--token-ttl", default="", metavar="DURATION",
                      help="how long the token is valid (e.g. 720h, 90m); default: until replaced")
    _connection_args(tadd)
    ttoken = tsub.add_parser("token", help="issue a tenant a new token (admin); its old one stops working")
    ttoken.add_argument("name")
    ttoken.add_argument("--ttl", default="", metavar="DURATION",
                        help="how long the new token is valid (e.g. 720h, 90m); default: until replaced")
    _connection_args(ttoken)
    tlist = tsub.add_parser("list", help="list tenants")
    _connection_args(tlist)

    serve = sub.add_parser("serve", help="run one control-plane service (configured by ROTA_* variables)")
    serve.add_argument("service", choices=(*SERVICES, CONSOLE))

    # Its flags are the agent's own (rota.agent.main.build_parser); see `rota agent --help`.
    sub.add_parser("agent", help="run a node agent", add_help=False, service="rota.agent.main")

    migrate = sub.add_parser("migrate", help="apply database migrations (ROTA_DATABASE_URL); with JOB: move a job")
    migrate.add_argument("--database-url", default=os.environ.get("ROTA_DATABASE_URL", ""))
    migrate.add_argument("--downgrade", metavar="REVISION", help="downgrade to REVISION instead")
    checkpoint_commands.extend_migrate(migrate, _connection_args, HANDLERS)

    bench = sub.add_parser("bench", help="benchmarks (allocator, ...)")
    bench.add_argument("target", help="what to benchmark")
    bench.add_argument("args", nargs=argparse.REMAINDER)

    sim = sub.add_parser("sim", help="trace-driven simulator (see `rota sim --help`)", add_help=False)
    sim.add_argument("args", nargs=argparse.REMAINDER)

    tune = sub.add_parser("tune", help="hyperparameter tuning: `rota tune FILE`, `rota tune status ID` "
                                       "(see `rota tune --help`)", add_help=False)
    tune.add_argument("args", nargs=argparse.REMAINDER)


# A shell's status for a writer killed by SIGPIPE (128 + 13), as `yes | head` leaves.
BROKEN_PIPE_EXIT = 141


def main(argv: list[str] | None = None) -> None:
    try:
        try:
            _main(sys.argv[1:] if argv is None else argv)
        finally:
            sys.stdout.flush()  # inside the try: what is still buffered meets the closed pipe here
    except BrokenPipeError:
        # `rota job ID --json | head`: the reader has all it wanted. Python's own flush at
        # exit would fail again on the closed pipe and print a warning; it writes to
        # /dev/null instead.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        sys.exit(BROKEN_PIPE_EXIT)


def _main(argv: list[str]) -> None:
    if argv[:1] == ["submit"]:
        # Over the api's JSON gateway when the cluster has one: no gRPC to import.
        from rota.cli import http_submit

        status = http_submit.main(build_parser(only="submit").parse_args(argv))
        if status is not None:
            sys.exit(status)
    from rota.cli import commands
    from rota.cli.output import fail
    from rota.cli.running import ServerPackagesMissing, run

    # `rota sim`, `rota tune` and `rota bench TARGET` own their flags (help included): pass them through.
    if argv[:1] in (["sim"], ["tune"]):
        handler = commands.sim if argv[0] == "sim" else commands.tune
        sys.exit(run(handler, argparse.Namespace(args=argv[1:])))
    if argv[:1] == ["bench"] and len(argv) > 1:
        sys.exit(run(commands.bench, argparse.Namespace(target=argv[1], args=argv[2:])))
    try:
        args = build_parser(only=argv[0] if argv else "").parse_args(argv)
    except ServerPackagesMissing as exc:  # `rota agent` on a client-only install
        sys.exit(fail(str(exc), 2))
    sys.exit(run(HANDLERS.get(args.command) or getattr(commands, args.command), args))


if __name__ == "__main__":
    main()


__all__ = ["build_parser", "main", "Path"]
