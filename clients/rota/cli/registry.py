"""Every `rota` command, in one table: its name, help, arguments, handler and whether it
talks to a cluster. `rota.cli.main` builds argparse from it and runs the chosen handler.

A handler (and an arguments builder that lives in a command module) is named
"module:function" and imported only when the command is built in full or run: the commands
scripts call in loops (`SCRIPTED`) are parsed with their own entry alone, so `rota submit`
over HTTP imports neither the gRPC client nor any other command's module. A command with
`server=True` gets the connection flags (--home, --endpoint, --token, --json) on its leaf
parser(s).

Adding a command: write its handler (and arguments builder) in a `*_commands.py` module and
add one `Command` row below.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rota.cli.components import CONSOLE, SERVICES

Handler = Callable[[argparse.Namespace], int]
Arguments = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    handler: str = ""  # "module:function"; a group's subcommands without one use the group's
    arguments: Arguments | str | None = None  # a function, or "module:function" (imported on a full build)
    server: bool = True  # talks to a cluster: --home, --endpoint, --token, --json
    subcommands: tuple[Command, ...] = ()
    dest: str = ""  # a group: the attribute naming its chosen subcommand
    metavar: str = "ACTION"
    add_help: bool = True
    service: str = ""  # flags (help included) from this server module's own build_parser()
    label: str = ""  # an argument whose value names what the command runs, in messages (`serve api`)
    optional_sub: bool = False  # a group that runs its own handler without a subcommand (`rota tenants`)


def resolve(name: str) -> Any:
    """The object "module:attribute" names, its module imported now."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


def connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", help="cluster folder written by `rota up` (default: $ROTA_HOME)")
    parser.add_argument("--endpoint", help="api address host:port (default: from the cluster folder)")
    parser.add_argument("--token", help="bearer token (default: $ROTA_TOKEN, else the admin token)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


# The arguments of the commands whose handlers sit in rota.cli.commands (kept here: the
# scripted ones are parsed without importing that module).
def _up(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", default=os.environ.get("ROTA_HOME", ".rota"), help="cluster folder (default: .rota)")
    p.add_argument("--nodes", type=int, default=None, help="virtual nodes (default: as many as --gpu-types or "
                   "--topology describe, else 2)")
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--gpu-types", default="", metavar="TYPE:NODES,...",
                   help="the nodes' GPU types in node order, e.g. a100:2,h100:1 (node-1 and node-2 a100, node-3 h100)")
    p.add_argument("--topology", default="", metavar="SWITCH:NODES,...",
                   help="the nodes' network switches in node order, e.g. s1:2,s2:2 (their `switch` label)")
    p.add_argument("--database-url", default=os.environ.get("ROTA_DATABASE_URL", ""), help="default: embedded PostgreSQL")
    p.add_argument("--redis-url", default=os.environ.get("ROTA_REDIS_URL", ""), help="default: embedded Redis")
    p.add_argument("--tracing", default=os.environ.get("ROTA_TRACING", "none"), choices=("none", "console", "otlp"))
    p.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between agent heartbeats")
    p.add_argument("--allocators", type=int, default=1, help="allocator replicas (one leads, the others stand by)")
    p.add_argument("--tls", action="store_true", help="mutual TLS everywhere: a local CA and certificates under HOME/tls")
    p.add_argument("--api-workers", type=int, default=1,
                   help="api processes sharing the api port (SO_REUSEPORT); more serve more submissions per second")
    p.add_argument("--console-port", type=int, default=0, metavar="PORT",
                   help="the web console's HTTP port on 127.0.0.1 (default: a free one; printed, and in cluster.json)")


def _down(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", help="cluster folder (default: $ROTA_HOME)")


def _demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", default=None, help="cluster folder (default: a temporary one)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--database-url", default=os.environ.get("ROTA_DATABASE_URL", ""))
    p.add_argument("--redis-url", default=os.environ.get("ROTA_REDIS_URL", ""))
    p.add_argument("--timeout", type=float, default=600, help="give up after this many seconds")


def _submit(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="a job file; several are sent together")
    p.add_argument("--tenant", help="override the file's tenant")
    p.add_argument("--request-id", help="idempotency key (default: a new one)")
    p.add_argument("--wait", action="store_true", help="wait until the job finishes")
    p.add_argument("--what-if", action="store_true",
                   help="submit nothing: say when the allocator would start it if submitted now")
    p.add_argument("--array", metavar="A-B[:STEP][%K]",
                   help="one job per index (0-99, 1,3,5-9), at most K running at once (over the file's array:)")
    p.add_argument("--after", action="append", metavar="ID",
                   help="start only after job or array ID succeeded (repeatable)")


def _jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", default="")
    p.add_argument("--mine", action="store_true", help="only the jobs your user token submitted")
    p.add_argument("--state", action="append", default=[], help="filter by state (repeatable)")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--watch", action="store_true",
                   help="a live table, redrawn every --interval seconds until Ctrl-C (with the same filters)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="with --watch (default: 2)")
    p.add_argument("--count", type=int, default=0, metavar="N",
                   help="with --watch: stop after N refreshes (default: 0, until Ctrl-C)")
    p.add_argument("--expand", action="store_true", help="list each task of an array (default: one row per array)")


def _id(p: argparse.ArgumentParser) -> None:
    p.add_argument("id")


def _logs(p: argparse.ArgumentParser) -> None:
    p.add_argument("id")
    p.add_argument("-f", "--follow", action="store_true")


def _cancel(p: argparse.ArgumentParser) -> None:
    p.add_argument("id")
    p.add_argument("--reason", default="")


def _tenant_add(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--share", type=float, default=1.0)
    p.add_argument("--token-ttl", default="", metavar="DURATION",
                   help="how long the token is valid (e.g. 720h, 90m); default: until replaced")
    resolve(_U + "quota_arguments")(p)


def _tenant_quota(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    resolve(_U + "quota_arguments")(p)


def _tenant_token(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--ttl", default="", metavar="DURATION",
                   help="how long the new token is valid (e.g. 720h, 90m); default: until replaced")


def _serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("service", choices=(*SERVICES, CONSOLE))


def _db_migrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", default=os.environ.get("ROTA_DATABASE_URL", ""))
    p.add_argument("--downgrade", metavar="REVISION", help="downgrade to REVISION instead")


def _bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="what to benchmark")
    p.add_argument("args", nargs=argparse.REMAINDER)


def _rest(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs=argparse.REMAINDER)


_C = "rota.cli.commands:"
_U = "rota.cli.user_commands:"
# The commands that run Rota's own processes: the server distribution's (rota.operator).
_OP = "rota.operator.commands:"
_CK = "rota.cli.checkpoint_commands:"
_D = "rota.cli.detector_commands:"
_F = "rota.cli.forecast_commands:"
_L = "rota.cli.ledger_commands:"

COMMANDS: tuple[Command, ...] = (
    # A local cluster.
    Command("up", "start a local cluster in the foreground", _OP + "up", _up, server=False),
    Command("down", "stop the local cluster", _OP + "down", _down, server=False),
    Command("demo", "start a cluster, run the example jobs, show them live, stop", _OP + "demo", _demo, server=False),
    # Jobs.
    Command("submit", "submit job files (YAML or JSON): one call, one connection", _C + "submit", _submit),
    Command("jobs", "list jobs", _C + "jobs", _jobs),
    Command("job", "show one job with its history and progress", _C + "job", _id),
    Command("explain", "why a job waits or where it runs", _C + "explain", _id),
    Command("logs", "print a job's log", _C + "logs", _logs),
    Command("cancel", "cancel a job", _C + "cancel", _cancel),
    Command("watch", "follow a job's events until it finishes", _C + "watch", _id),
    Command("nodes", "list nodes with their GPUs and health", _C + "nodes"),
    # The allocator, the ledger, the forecaster.
    Command("plan", "show the allocator's current plan (GPU rows x timesteps)", "rota.cli.plan_commands:plan",
            "rota.cli.plan_commands:plan_arguments"),
    Command("usage", "GPU-hours used, raw and weighted by GPU type, from the ledger", _L + "usage",
            _L + "usage_arguments"),
    Command("fairness", "per tenant: quota, entitled, deserved, used (weighted), F (--jobs: per job)",
            _L + "fairness", _L + "fairness_arguments"),
    Command("forecast", "predict a job file's duration and GPU-hours before submitting it", _F + "forecast",
            _F + "forecast_arguments"),
    Command("traffic", "realtime apps' traffic history and demand forecasts", _F + "traffic", dest="traffic_command",
            subcommands=(
                Command("push", "record an app's hourly request counts from a CSV or JSON file",
                        arguments=_F + "push_arguments"),
                Command("curve", "the app's forecast GPUs for the next hours", arguments=_F + "curve_arguments"),
            )),
    # Checkpoints.
    Command("checkpoint", "copy a running job's state into a new image", _CK + "checkpoint", _CK + "image_arguments"),
    Command("pause", "checkpoint a running job and stop it (PAUSED, GPUs free)", _CK + "pause", _CK + "image_arguments"),
    Command("resume", "put a paused job back in the queue from its last image", _CK + "resume",
            _CK + "resume_arguments"),
    Command("checkpoints", "a job's checkpoint images: sizes, dedup, how long each took", _CK + "checkpoints",
            _CK + "checkpoints_arguments"),
    Command("move", "pause a running job and resume it elsewhere (on --to NODE if given), its state streamed",
            _CK + "move", _CK + "move_arguments"),
    # The failure detector.
    Command("health", "nodes, devices and the failure detector's verdicts with their evidence", _D + "health",
            _D + "health_arguments"),
    Command("drain", "place nothing new on a node (admin); running jobs go on", _D + "drain", _D + "drain_arguments"),
    Command("replan", "the 3-D re-plan of a job around its slow and dead ranks; --apply restarts it with the new layout",
            _D + "replan_cmd", _D + "replan_arguments"),
    # A deployment.
    Command("certs", "make a CA and the mutual-TLS certificates a deployment mounts", "rota.cli.deploy_commands:certs",
            "rota.cli.deploy_commands:certs_arguments", server=False),
    Command("probe", "health check of one service or agent (exit 0 when SERVING)", "rota.cli.probe:run",
            "rota.cli.probe:add_arguments", server=False),
    Command("slurm-shims", "put Slurm's command names (sbatch, squeue, ...) in DIR, running Rota's",
            "rota.cli.slurm_shims:write", "rota.cli.slurm_shims:arguments", server=False),
    Command("tenants", "tenants with their quotas: guaranteed / limit / in use / borrowed", _C + "tenants",
            dest="tenants_command", optional_sub=True, subcommands=(
        Command("add", "create a tenant (admin) and print its token; --guaranteed G --limit L", arguments=_tenant_add),
        Command("token", "issue a tenant a new token (admin); its old one stops working", arguments=_tenant_token),
        Command("quota", "set a tenant's quota (admin): --guaranteed G --limit L [--parent P] [--gpu-limit TYPE=N]",
                _U + "set_quota", _tenant_quota),
        Command("list", "list tenants (the same as `rota tenants`)"),
    )),
    Command("users", "a tenant's users, each with its own token", _U + "users", dest="users_command", subcommands=(
        Command("add", "create a user (admin or tenant admin) and print its token", arguments=_U + "user_add_arguments"),
        Command("list", "list users with their tokens' expiry and last use", arguments=_U + "users_arguments"),
        Command("revoke", "revoke a user's token (refused from the next call on)", arguments=_U + "user_name_arguments"),
        Command("token", "issue a user a new token; its old one stops working", arguments=_U + "user_token_arguments"),
    )),
    Command("serve", "run one control-plane service (configured by ROTA_* variables)", _OP + "serve", _serve,
            server=False, label="service"),
    # Its flags are the agent's own (rota.agent.main.build_parser); see `rota agent --help`.
    Command("agent", "run a node agent", _OP + "agent", server=False, add_help=False, service="rota.agent.main"),
    Command("db", "the control plane's database", dest="db_command", server=False, subcommands=(
        Command("migrate", "apply database migrations (ROTA_DATABASE_URL)", _OP + "db_migrate", _db_migrate,
                server=False),
    )),
    # Their own flags, help included, after the command's name: `rota main` passes them through.
    Command("bench", "benchmarks (allocator, ...)", _C + "bench", _bench, server=False),
    Command("sim", "trace-driven simulator (see `rota sim --help`)", _C + "sim", _rest, server=False, add_help=False),
    Command("tune", "hyperparameter tuning: `rota tune FILE`, `rota tune status ID` (see `rota tune --help`)",
            _C + "tune", _rest, server=False, add_help=False),
)
BY_NAME = {c.name: c for c in COMMANDS}
# The commands scripts call in loops (`for f in *.yaml; do rota submit $f; done`): parsed
# with only their own entry, so a call imports the SDK and its one handler module, not
# every command's (the others bring the local cluster, certificates, plots).
SCRIPTED = ("submit", "jobs", "job", "logs", "cancel", "watch", "nodes", "explain")


def add_command(sub: Any, command: Command) -> argparse.ArgumentParser:
    """The command's parser (and its subcommands'), added to `sub`."""
    extra = {"service": command.service} if command.service else {}
    parser: argparse.ArgumentParser = sub.add_parser(command.name, help=command.help, add_help=command.add_help, **extra)
    if command.subcommands:
        group = parser.add_subparsers(dest=command.dest, required=not command.optional_sub, metavar=command.metavar)
        for child in command.subcommands:
            add_command(group, child)
        if command.optional_sub and command.server:
            connection_arguments(parser)
        return parser
    arguments = resolve(command.arguments) if isinstance(command.arguments, str) else command.arguments
    if arguments is not None:
        arguments(parser)
    if command.server:
        connection_arguments(parser)
    return parser


def handler_of(args: argparse.Namespace) -> Handler:
    """The handler of the command `args` chose: its subcommand's own, else the command's."""
    command = BY_NAME[args.command]
    if command.subcommands:
        chosen = getattr(args, command.dest)
        command = next((c for c in command.subcommands if c.name == chosen and c.handler), command)
    handler: Handler = resolve(command.handler)
    return handler


def label_of(args: argparse.Namespace) -> str:
    """The command `args` chose as its user typed it, for messages: `up`, `db migrate`, `serve api`."""
    command = BY_NAME[args.command]
    words = [command.name]
    if command.subcommands:
        words.append(str(getattr(args, command.dest)))
    if command.label:
        words.append(str(getattr(args, command.label)))
    return " ".join(words)


__all__ = ["BY_NAME", "COMMANDS", "SCRIPTED", "Command", "add_command", "connection_arguments", "handler_of", "label_of", "resolve"]
