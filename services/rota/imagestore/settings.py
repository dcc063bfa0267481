"""Checkpoint settings, read from ROTA_* variables by the coordinator and the agents.

    ROTA_CHUNK_STORE            chunk store directory (default ROTA_HOME/chunks: shared by
                                every agent of a local cluster; a shared mount elsewhere)
    ROTA_CHUNK_SIZE_MB          fixed chunk size (default 4; see bench/checkpoint/README.md)
    ROTA_CHECKPOINT_FSYNC       1 (default): a chunk is on disk before its image is complete
    ROTA_CHECKPOINT_VERIFY      1: a restore checks every chunk's digest first (default 0: about
                                a second per 2 GB here; chunks are written once, atomically)
    ROTA_STAGING_ROOT           where ranks copy their state (default a tmpfs: /dev/shm)
    ROTA_CHECKPOINT_TIMEOUT     seconds every rank has to reach a safe point (default 10)
    ROTA_CHECKPOINT_INTERVAL    periodic checkpoints of running jobs, seconds (0: off; default 0)
    ROTA_CHECKPOINT_KEEP        complete images kept per job (default 3)
    ROTA_CHECKPOINT_GC_INTERVAL seconds between retention + garbage collection runs (default 300)
    ROTA_CHECKPOINT_GC_GRACE    a chunk younger than this is never collected (default 600)
    ROTA_CHECKPOINT_STREAM      1 (default): a migration of a one-node job resumes it as soon as
                                the copy is taken, the target streaming the state from the
                                source agent while the durable write goes on; 0: after the write
    ROTA_CHECKPOINT_HANDOFF     1 (default): a restore on the source's own host takes its staged
                                copy by hard links; 0: it streams or reads the store like any other
    ROTA_CHECKPOINT_STREAMS     streams in flight from a migration's source agent (default 4)
    ROTA_CHECKPOINT_STREAM_MBPS what a source agent sends to targets at most, MB/s (0: no cap; the
                                default), so a migration does not flood a link training shares
    ROTA_CHECKPOINT_WRITE_MBPS  what an agent's background image write puts in the store at most,
                                MB/s (0: no cap; the default)
    ROTA_ZERO_COPY              read by a job's runtime: 1 (default) a restore maps the chunk
                                files in place (rota.imageformat.mapping); 0: it copies each tensor out
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The chunk store, not the image format (rota.imagestore.images, which loads the job runtime):
# every process reads these settings, a health probe included.
from rota.imagestore.chunks import DEFAULT_CHUNK_SIZE, MIB, FileChunkStore

# After "commit", how long a paused job's ranks have to exit (they skip the interpreter's
# teardown, so a fraction of a second); a pause's time is this plus the safe-point wait,
# and both fit in a service call's default deadline (30 s).
EXIT_GRACE_S = 10.0


def _float(name: str, default: float, minimum: float = 0.0) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError as exc:
        raise ValueError(f"{name}: not a number: {raw!r}") from exc
    if value < minimum:
        raise ValueError(f"{name}: must be at least {minimum:g}, got {value:g}")
    return value


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "")
    return default if not raw else raw not in ("0", "false", "no", "off")


def default_staging_root(node: str) -> Path:
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(os.environ.get("TMPDIR", "/tmp"))
    return base / f"rota-{os.getuid()}" / node


@dataclass(frozen=True)
class CheckpointSettings:
    store_dir: Path
    chunk_size: int = DEFAULT_CHUNK_SIZE
    fsync: bool = True
    verify: bool = False
    staging_root: Path | None = None
    timeout_s: float = 10.0
    interval_s: float = 0.0
    keep: int = 3
    gc_interval_s: float = 300.0
    gc_grace_s: float = 600.0
    stream_migrations: bool = True
    handoff: bool = True
    streams: int = 4
    stream_mbps: float = 0.0
    write_mbps: float = 0.0

    @staticmethod
    def from_env(home: Path) -> CheckpointSettings:
        staging = os.environ.get("ROTA_STAGING_ROOT")
        return CheckpointSettings(
            store_dir=Path(os.environ.get("ROTA_CHUNK_STORE") or home / "chunks"),
            chunk_size=int(_float("ROTA_CHUNK_SIZE_MB", DEFAULT_CHUNK_SIZE / MIB, 1 / 1024) * MIB),
            fsync=_flag("ROTA_CHECKPOINT_FSYNC", True),
            verify=_flag("ROTA_CHECKPOINT_VERIFY", False),
            staging_root=Path(staging) if staging else None,
            timeout_s=_float("ROTA_CHECKPOINT_TIMEOUT", 10.0, 0.1),
            interval_s=_float("ROTA_CHECKPOINT_INTERVAL", 0.0),
            keep=int(_float("ROTA_CHECKPOINT_KEEP", 3, 1)),
            gc_interval_s=_float("ROTA_CHECKPOINT_GC_INTERVAL", 300.0, 0.1),
            gc_grace_s=_float("ROTA_CHECKPOINT_GC_GRACE", 600.0),
            stream_migrations=_flag("ROTA_CHECKPOINT_STREAM", True),
            handoff=_flag("ROTA_CHECKPOINT_HANDOFF", True),
            streams=int(_float("ROTA_CHECKPOINT_STREAMS", 4, 1)),
            stream_mbps=_float("ROTA_CHECKPOINT_STREAM_MBPS", 0.0),
            write_mbps=_float("ROTA_CHECKPOINT_WRITE_MBPS", 0.0),
        )

    def store(self) -> FileChunkStore:
        return FileChunkStore(self.store_dir, fsync=self.fsync)
