"""`python -m rota.slurm NAME ARGS...`: one of Slurm's commands (what `rota slurm-shims` writes)."""

from __future__ import annotations

import sys

from rota.slurm import commands

ENTRIES = {"sbatch": commands.sbatch, "squeue": commands.squeue, "sacct": commands.sacct,
           "scancel": commands.scancel, "srun": commands.srun, "scontrol": commands.scontrol}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ENTRIES:
        print(f"usage: python -m rota.slurm {{{','.join(ENTRIES)}}} ARGS...", file=sys.stderr)
        sys.exit(2)
    sys.exit(ENTRIES[sys.argv[1]](sys.argv[2:]))
