"""Slurm's commands over Rota: `sbatch`, `squeue`, `sacct`, `scancel`, `srun` and `scontrol
requeue` for scripts and tools written for Slurm (submitit among them).

`directives` reads `#SBATCH` lines and command-line options (refusing the ones Rota cannot
honour, by name), `translate` turns them into a Rota job file, `ids` maps Rota's ids to
Slurm's numbers and node lists to Slurm's compressed form, `batch` runs the script inside the
job with Slurm's variables, `commands` holds the commands' entry points.
"""
