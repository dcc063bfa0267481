"""The `rota` command. Cluster commands go through the SDK (`rota.client`).

Human-readable output by default, `--json` for scripts; any error exits non-zero with one
line on stderr naming the field or the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

# platformdirs (pulled in by the embedded servers) warns on machines without a login session.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from rota.cli.registry import COMMANDS, SCRIPTED, Handler, add_command, handler_of, label_of, resolve  # noqa: E402
from rota.cli.running import is_server_module  # noqa: E402

# Filled by build_parser(): each command's handler, by name (a group's, such as `tenants`).
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


def build_parser(only: str = "") -> argparse.ArgumentParser:
    """The whole CLI from the registry (rota.cli.registry), filling HANDLERS; with `only` one
    of SCRIPTED, that command alone, built without importing any handler (`rota submit` over
    HTTP needs no gRPC client)."""
    parser = _Parser(prog="rota", description="Rota: a control plane for shared GPU clusters.")
    # Every subcommand's parser is a _Parser; the registry takes them as plain ArgumentParsers.
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser))
    for command in COMMANDS:
        if only in SCRIPTED and command.name != only:
            continue
        add_command(sub, command)
        if only not in SCRIPTED and command.handler:
            try:
                HANDLERS[command.name] = resolve(command.handler)
            except ModuleNotFoundError as exc:
                if not is_server_module(exc):
                    raise
                # A client-only install: the command is listed; running it says what to install.
    return parser


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
    from rota.cli.output import fail
    from rota.cli.running import ServerPackagesMissing, run

    # `rota sim`, `rota tune` and `rota bench TARGET` own their flags (help included): pass them through.
    if argv[:1] in (["sim"], ["tune"]):
        sys.exit(run(handler_of(argparse.Namespace(command=argv[0])), argparse.Namespace(args=argv[1:])))
    if argv[:1] == ["bench"] and len(argv) > 1:
        sys.exit(run(handler_of(argparse.Namespace(command="bench")), argparse.Namespace(target=argv[1], args=argv[2:])))
    try:
        args = build_parser(only=argv[0] if argv else "").parse_args(argv)
    except ServerPackagesMissing as exc:  # `rota agent` on a client-only install
        sys.exit(fail(str(exc), 2))
    try:
        handler = handler_of(args)
    except ModuleNotFoundError as exc:  # a command of the server distribution on a client-only install
        if not is_server_module(exc):
            raise
        sys.exit(fail(str(ServerPackagesMissing(label_of(args))), 2))
    sys.exit(run(handler, args))


if __name__ == "__main__":
    main()


__all__ = ["build_parser", "main", "Path"]
