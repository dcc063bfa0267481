"""The measurement behind the default chunk size (`rota bench checkpoint --chunk-sweep`).

A 256 MB state (float32 tensors of up to 64 MB) on two replicated ranks is staged once;
for each chunk size, into an empty store: the write (hash + store, both ranks: the
second deduplicated), a restore (rank 0 mapped in place from the chunk files, lazily: nothing is read), a second image
after a typical sparse update (three contiguous 256 KB runs changed in every tensor, as an
embedding's touched rows), whose new bytes show how finely unchanged data is reused.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rota import imageformat
from rota.imagestore.chunks import MIB, FileChunkStore
from rota.imagestore.images import link, write_staged
from rota.imagestore.settings import default_staging_root

STATE_MB = 256
TENSOR_MB = 64
SIZES_MB = (0.25, 1.0, 4.0, 16.0, 64.0)
REPEATS = 3  # medians: the machine is shared, single runs are noisy
RUN = 256 * 1024  # bytes changed per run by the sparse update


def _state(seed: int, touched: bool) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    n = TENSOR_MB * MIB // 4
    tensors = [torch.randn(n, generator=gen) for _ in range(STATE_MB // TENSOR_MB)]
    if touched:
        for t in tensors:
            for k in range(3):
                start = (k * 2 + 1) * n // 7
                t[start: start + RUN // 4] += 1.0
    return {"object:model": tensors}


def measure(work: Path) -> list[dict[str, Any]]:
    staging = default_staging_root("sweep").parent / f"sweep-{time.time_ns()}"
    try:
        first, second = staging / "first", staging / "second"
        for folder, touched in ((first, False), (second, True)):
            state = _state(7, touched)
            for rank in range(2):
                imageformat.stage(folder, rank, 2, 1, state)
        rows = []
        for size_mb in SIZES_MB:
            writes, restores = [], []
            for _ in range(REPEATS):
                store = FileChunkStore(work / f"store-{size_mb:g}")
                written = write_staged(store, first, 2, int(size_mb * MIB))
                again = write_staged(store, second, 2, int(size_mb * MIB))
                started = time.perf_counter()
                link(store, written.manifest, work / f"restore-{size_mb:g}")
                imageformat.load(work / f"restore-{size_mb:g}", 0)  # the restore path: mapped in place, unread
                restores.append(written.logical_bytes / 2 / (time.perf_counter() - started) / 1e9)
                writes.append(written.logical_bytes / written.seconds / 1e9)
                shutil.rmtree(work / f"store-{size_mb:g}", ignore_errors=True)
                shutil.rmtree(work / f"restore-{size_mb:g}", ignore_errors=True)
            rows.append({
                "chunk_mb": size_mb, "chunks": written.chunks, "write_gb_s": statistics.median(writes),
                "restore_gb_s": statistics.median(restores), "stored_mb": written.written_bytes / MIB,
                "update_new_mb": again.written_bytes / MIB,
            })
        return rows
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(json_out: bool = False) -> int:
    with tempfile.TemporaryDirectory(prefix="rota-chunk-sweep-") as tmp:
        rows = measure(Path(tmp))
    if json_out:
        print(json.dumps({"state_mb": STATE_MB, "ranks": 2, "rows": rows}, indent=2))
        return 0
    print(f"{STATE_MB} MB state on 2 replicated ranks (logical {2 * STATE_MB} MB); update: 3 x 256 KB per 64 MB tensor")
    print(f"{'CHUNK':>8} {'CHUNKS':>7} {'WRITE GB/s':>11} {'RESTORE GB/s':>13} {'STORED MB':>10} {'UPDATE NEW MB':>14}")
    for r in rows:
        print(f"{r['chunk_mb']:>6g}MB {r['chunks']:>7} {r['write_gb_s']:>11.2f} {r['restore_gb_s']:>13.2f} "
              f"{r['stored_mb']:>10.1f} {r['update_new_mb']:>14.1f}")
    return 0
