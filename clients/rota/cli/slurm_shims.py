"""`rota slurm-shims DIR`: Slurm's plain command names in DIR, each running Rota's command
(rota.slurm), so scripts and tools that call `sbatch`, `squeue`, `sacct`, `scancel`, `srun`
and `scontrol` work once DIR is on the PATH. Opt-in: nothing is put on the PATH otherwise."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

NAMES = ("sbatch", "squeue", "sacct", "scancel", "srun", "scontrol")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="folder to write the commands in (created); put it on the PATH")
    parser.add_argument("--force", action="store_true", help="replace files of those names already there")


def shim_text(name: str) -> str:
    # The interpreter that runs `rota` now: it has rota.slurm installed beside rota.cli.
    return f'#!/bin/sh\n# Slurm\'s {name} over Rota (rota slurm-shims)\nexec {shlex.quote(sys.executable)} -m rota.slurm {name} "$@"\n'


def write(args: argparse.Namespace) -> int:
    folder = Path(args.dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        path = folder / name
        if path.exists() and not args.force and path.read_text(errors="replace") != shim_text(name):
            print(f"rota: {path}: exists (not a Rota shim); --force replaces it", file=sys.stderr)
            return 1
        path.write_text(shim_text(name))
        path.chmod(0o755)
    print(f"wrote {', '.join(NAMES)} in {folder}; use them with: export PATH={shlex.quote(str(folder))}:$PATH")
    return 0
