"""The Slurm front door's shared folder: where a job's launcher (rota.slurm.batch), the
`srun` steps inside it, and `scancel --signal` / `scontrol requeue` from anywhere meet.

Like submitit's own folder, it must be on a filesystem every node and the login host
share: $ROTA_SLURM_SPOOL, else ~/.rota/slurm. One folder per Rota job id:
    script      the batch script as submitted
    steps/PID   a running `srun`: signals for the job's steps go to these processes
    signals/*   requests "SIGNAL TARGET" (TARGET: steps, batch or all) the launcher delivers
    requeue     `scontrol requeue`: the launcher stops the script and asks Rota for another run
    final       "STATE CODE" of an ended run that Rota's retries must not repeat (FAILED, TIMEOUT)
    restarts    how many runs came before this one
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

TARGETS = ("steps", "batch", "all")


def root(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("ROTA_SLURM_SPOOL") or Path.home() / ".rota" / "slurm").resolve()


def job_folder(base: Path, rota_id: str) -> Path:
    return base / rota_id


def folders_of(base: Path, rota_id: str) -> list[Path]:
    """The job's folder, or every task's of an array (`scancel --signal ARRAY`)."""
    own = job_folder(base, rota_id)
    return [own] if own.is_dir() or "_" in rota_id else sorted(base.glob(f"{rota_id}_*")) or [own]


def request_signal(folder: Path, name: str, target: str) -> None:
    """Queues a signal for a job's launcher to deliver (written whole, then renamed)."""
    requests = folder / "signals"
    requests.mkdir(parents=True, exist_ok=True)
    partial = requests / f".{uuid.uuid4().hex}"
    partial.write_text(f"{name} {target}\n")
    partial.rename(requests / partial.name[1:])


def take_signals(folder: Path) -> list[tuple[str, str]]:
    """The queued signal requests, oldest first, each removed as it is read."""
    requests = folder / "signals"
    if not requests.is_dir():
        return []
    taken: list[tuple[str, str]] = []
    for path in sorted(requests.iterdir(), key=lambda p: p.stat().st_mtime):
        if path.name.startswith("."):
            continue
        name, _, target = path.read_text().strip().partition(" ")
        path.unlink(missing_ok=True)
        taken.append((name, target if target in TARGETS else "steps"))
    return taken


def read_final(folder: Path) -> tuple[str, int] | None:
    path = folder / "final"
    if not path.exists():
        return None
    state, _, code = path.read_text().strip().partition(" ")
    return state, int(code or 1)
