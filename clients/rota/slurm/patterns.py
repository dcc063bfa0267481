"""Slurm's filename patterns for --output/--error: %j %A %a %x %u %N %n %t %s %%."""

from __future__ import annotations

import getpass
import re

_PATTERN = re.compile(r"%(\d*)([jAaxuNntsJ%])")


def expand(pattern: str, env: dict[str, str], task: int | None = None) -> str:
    """`pattern` with Slurm's replacements from the job's SLURM_* variables; %t and %n only for a task."""
    array = env.get("SLURM_ARRAY_TASK_ID")
    values = {
        "j": env.get("SLURM_JOB_ID", ""), "J": env.get("SLURM_JOB_ID", ""),
        "A": env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID", ""),
        "a": array if array is not None else "4294967294",  # Slurm's value outside an array
        "x": env.get("SLURM_JOB_NAME", ""), "u": getpass.getuser(),
        "N": env.get("SLURMD_NODENAME", ""), "n": env.get("SLURM_NODEID", "0"),
        "s": env.get("SLURM_STEP_ID", "batch"), "%": "%",
    }

    def one(found: re.Match[str]) -> str:
        letter = found.group(2)
        if letter == "t":
            return str(task) if task is not None else found.group(0)
        value = values[letter]
        width = found.group(1)
        return value.zfill(int(width)) if width and value.isdigit() else value

    return _PATTERN.sub(one, pattern)
