"""The commands' entry points (`rota-sbatch`, ... in clients/pyproject.toml; the plain Slurm
names through `rota slurm-shims DIR`). Each prints Slurm's output; an error is one line on
stderr naming the option or the reason, and exit status 1."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rota.client import Client
from rota.client.errors import RotaError
from rota.slurm import directives, ids, listing, spool, steps, submit, translate


def _run(name: str, body: Callable[[list[str]], int], argv: Sequence[str] | None) -> int:
    try:
        return body(list(sys.argv[1:] if argv is None else argv))
    except (directives.DirectiveError, listing.FormatError, ids.SlurmIdError, steps.StepError) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
    except RotaError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
    except ValueError as exc:  # the SDK's job-file checks name the field
        print(f"{name}: error: {exc}", file=sys.stderr)
    return 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise directives.DirectiveError(message)


def sbatch(argv: Sequence[str] | None = None) -> int:
    return _run("sbatch", submit.sbatch, argv)


def _listing_parser(prog: str, noheader: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, add_help=False)  # squeue's -h is --noheader
    parser.add_argument("--help", action="help")
    parser.add_argument("-j", "--jobs", action="append", default=[])
    parser.add_argument("-o", "--format", default="")
    parser.add_argument(noheader, "--noheader", action="store_true")
    parser.add_argument("--me", action="store_true")
    parser.add_argument("-u", "--user", default="")
    return parser


def _selected(client: Client, args: argparse.Namespace, active: bool) -> list[listing.Job]:
    numbers = [n for item in args.jobs for n in item.split(",") if n]
    if numbers:
        jobs = listing.jobs_named(client, numbers)
    else:
        jobs = client.list_jobs(states=listing.ACTIVE if active else ())
    if args.me or args.user:
        admin, tenant = client.whoami()
        wanted = args.user or ("" if admin else tenant)
        jobs = [j for j in jobs if not wanted or j.tenant == wanted]
    return [j for j in jobs if not active or j.state in listing.ACTIVE]


def _squeue(argv: list[str]) -> int:
    args = _listing_parser("squeue", "-h").parse_args(argv)
    columns = listing.squeue_columns(args.format)
    with Client.from_env() as client:
        jobs = _selected(client, args, active=True)
    print(listing.render(columns, jobs, header=not args.noheader, separator=None))
    return 0


def squeue(argv: Sequence[str] | None = None) -> int:
    return _run("squeue", _squeue, argv)


def _sacct(argv: list[str]) -> int:
    parser = _listing_parser("sacct", "-n")
    parser.add_argument("-P", "--parsable2", action="store_true")
    parser.add_argument("-p", "--parsable", action="store_true")
    parser.add_argument("-X", "--allocations", action="store_true")  # Rota has no steps to hide
    args = parser.parse_args(argv)
    columns = listing.sacct_columns(args.format)
    with Client.from_env() as client:
        jobs = _selected(client, args, active=False)
    separator = "|" if args.parsable2 or args.parsable else None
    text = listing.render(columns, jobs, header=not args.noheader, separator=separator, trailing=args.parsable)
    if separator is None and not args.noheader:
        lines = text.split("\n")
        lines.insert(1, " ".join("-" * abs(c.width) for c in columns))
        text = "\n".join(lines)
    print(text)
    return 0


def sacct(argv: Sequence[str] | None = None) -> int:
    return _run("sacct", _sacct, argv)


def _scancel(argv: list[str]) -> int:
    parser = _Parser(prog="scancel")
    parser.add_argument("ids", nargs="+")
    parser.add_argument("-s", "--signal", default="")
    parser.add_argument("-b", "--batch", action="store_true")
    parser.add_argument("-f", "--full", action="store_true")
    args = parser.parse_args(argv)
    targets = [ids.rota_id(i) for i in args.ids]
    if args.signal:
        name = translate.signal_of(args.signal)[0]
        where = "all" if args.full else "batch" if args.batch else "steps"
        for rota_id in targets:
            for folder in spool.folders_of(spool.root(), rota_id):
                spool.request_signal(folder, name, where)
        return 0
    with Client.from_env() as client:
        for rota_id in targets:
            client.cancel_job_or_array(rota_id, reason="scancel")
    return 0


def scancel(argv: Sequence[str] | None = None) -> int:
    return _run("scancel", _scancel, argv)


def _scontrol(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "requeue":
        raise directives.DirectiveError(f"scontrol {' '.join(argv[:1])}: only `scontrol requeue JOBID` is supported")
    folder = spool.job_folder(spool.root(), ids.rota_id(argv[1]))
    if not folder.is_dir():
        raise directives.DirectiveError(f"scontrol requeue {argv[1]}: the job is not running here")
    (folder / "requeue").write_text("scontrol requeue\n")
    return 0


def scontrol(argv: Sequence[str] | None = None) -> int:
    return _run("scontrol", _scontrol, argv)


def srun(argv: Sequence[str] | None = None) -> int:
    return _run("srun", steps.srun, argv)
