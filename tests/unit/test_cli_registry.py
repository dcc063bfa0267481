"""The CLI's one command registry: every command is one row, main.py's parser is built from
it, each row's handler resolves, and `rota db migrate` and `rota move JOB` are apart."""

from __future__ import annotations

import argparse
import inspect

import pytest

from rota.cli import checkpoint_commands, commands
from rota.cli.main import HANDLERS, build_parser
from rota.cli.registry import BY_NAME, COMMANDS, SCRIPTED, handler_of, resolve
from rota.operator import commands as operator_commands


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_parser_holds_exactly_the_registry_s_commands_in_its_order() -> None:
    assert list(_choices(build_parser())) == [c.name for c in COMMANDS]
    assert len(BY_NAME) == len(COMMANDS), "no name twice"
    assert set(SCRIPTED) <= set(BY_NAME)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_handler_and_arguments_builder_resolves(command: object) -> None:
    rows = [command, *getattr(command, "subcommands", ())]
    for row in rows:
        if row.handler:
            handler = resolve(row.handler)
            assert callable(handler) and list(inspect.signature(handler).parameters) == ["args"], row.name
        if isinstance(row.arguments, str):
            assert callable(resolve(row.arguments)), row.name
    assert command.handler or all(c.handler for c in command.subcommands), "every leaf runs something"


@pytest.mark.parametrize(("name", "server"), [(c.name, c.server) for c in COMMANDS if not c.subcommands])
def test_a_command_that_talks_to_a_cluster_takes_the_connection_flags(name: str, server: bool) -> None:
    parser = _choices(build_parser())[name]
    flags = {o for a in parser._actions for o in a.option_strings}
    if BY_NAME[name].service:
        return  # `rota agent`: its own parser's flags
    assert ({"--home", "--endpoint", "--token", "--json"} <= flags) is server


def test_db_migrate_migrates_the_database_and_move_moves_a_job() -> None:
    parser = build_parser()
    db = parser.parse_args(["db", "migrate", "--database-url", "postgresql://x/y", "--downgrade", "0008"])
    assert handler_of(db) is operator_commands.db_migrate
    assert (db.database_url, db.downgrade) == ("postgresql://x/y", "0008")
    moved = parser.parse_args(["move", "j-1", "--to", "node-2", "--wait", "5"])
    assert handler_of(moved) is checkpoint_commands.move
    assert (moved.job, moved.to, moved.wait) == ("j-1", "node-2", 5.0)


@pytest.mark.parametrize("argv", [["migrate"], ["migrate", "j-1"], ["move"], ["db"]])
def test_the_old_double_meaning_is_gone(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(argv)
    assert done.value.code == 2
    assert "rota" in capsys.readouterr().err


def test_a_group_runs_its_own_handler_for_each_action() -> None:
    parser = build_parser()
    assert handler_of(parser.parse_args(["tenants", "list"])) is commands.tenants
    assert handler_of(parser.parse_args(["traffic", "curve", "app"])) is HANDLERS["traffic"]
    assert {"up", "submit", "plan", "usage", "checkpoints", "health", "certs", "serve", "sim", "move"} <= set(HANDLERS)
