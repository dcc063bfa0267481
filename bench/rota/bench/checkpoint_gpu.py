"""`rota bench checkpoint --gpu`: pause and restore of a CUDA model's state against
torch.save / torch.load of the same CUDA state, in one process (no cluster, no process
start: the state's way out of and back into device memory is all that is timed).

    rota bench checkpoint --gpu [--sizes 500,2048] [--repeats 5] [--device cuda] [--json]

Per size (parameters plus Adam's two moments, float32, on the device):
- pause_copy_s: rota.runtime's copy at a safe point (`imageformat.stage`: device to host
  through a pinned buffer reused between pauses, into a tmpfs file) ;
- durable_s: that copy plus its write into an empty chunk store (hash + write);
- restore_s: the image read in place from the store's chunk files (zero-copy) and copied
  into the model's device tensors, synchronised;
- baseline save_s: torch.save of the device state to the same tmpfs; load_s: torch.load
  with map_location the device, copied into the model's device tensors, synchronised.
Medians over the repeats, with [min, max].
"""

from __future__ import annotations

import argparse
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

TENSOR_MB = 64


def device_state(state_mb: float, device: str) -> dict[str, Any]:
    import torch

    n_params = max(1, int(state_mb * MIB / 3 / 4))
    step = TENSOR_MB * MIB // 4
    gen = torch.Generator(device=device).manual_seed(1)
    params = [torch.randn(min(step, n_params - s), generator=gen, device=device) for s in range(0, n_params, step)]
    moments = [[torch.randn(p.shape, generator=gen, device=device) for p in params] for _ in range(2)]
    return {"object:model": {f"p{i}": p for i, p in enumerate(params)},
            "object:optimizer": {"exp_avg": moments[0], "exp_avg_sq": moments[1]}}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _into(live: dict[str, Any], loaded: dict[str, Any], device: str) -> None:
    """What load_state_dict does: every tensor copied into the live device tensor."""
    for key, entry in live.items():
        if isinstance(entry, dict):
            for name, t in entry.items():
                src = loaded[key][name]
                if isinstance(t, list):
                    for a, b in zip(t, src, strict=True):
                        a.copy_(b, non_blocking=True)
                else:
                    t.copy_(src, non_blocking=True)
    _sync(device)


def measure(state_mb: float, repeats: int, device: str, work: Path) -> dict[str, Any]:
    import torch

    state = device_state(state_mb, device)
    staging = default_staging_root("gpu-bench").parent / f"gpu-bench-{time.time_ns()}"
    times: dict[str, list[float]] = {k: [] for k in ("pause_copy_s", "durable_s", "restore_s", "save_s", "load_s")}
    try:
        for r in range(repeats):
            folder, store = staging / f"stage-{r}", FileChunkStore(work / f"store-{r}", fsync=False)
            _sync(device)
            began = time.perf_counter()
            imageformat.stage(folder, 0, 1, r, state)
            times["pause_copy_s"].append(time.perf_counter() - began)
            written = write_staged(store, folder, 1)
            times["durable_s"].append(time.perf_counter() - began)
            began = time.perf_counter()
            assert link(store, written.manifest, work / f"restore-{r}")
            _, loaded = imageformat.load(work / f"restore-{r}", 0)
            _into(state, loaded, device)
            times["restore_s"].append(time.perf_counter() - began)
            del loaded
            shutil.rmtree(folder, ignore_errors=True)

            path = staging / f"state-{r}.pt"
            _sync(device)
            began = time.perf_counter()
            torch.save(state, path)
            times["save_s"].append(time.perf_counter() - began)
            began = time.perf_counter()
            saved = torch.load(path, map_location=device)
            _into(state, saved, device)
            times["load_s"].append(time.perf_counter() - began)
            del saved
            path.unlink()
            shutil.rmtree(work / f"store-{r}", ignore_errors=True)
            shutil.rmtree(work / f"restore-{r}", ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    out: dict[str, Any] = {"state_mb": state_mb, "device": device, "repeats": repeats}
    for key, values in times.items():
        out[key] = round(statistics.median(values), 4)
    out["spread"] = {k: [round(min(v), 4), round(max(v), 4)] for k, v in times.items()}
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rota bench checkpoint --gpu", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", default="500,2048", help="state sizes in MB, comma-separated (default 500,2048)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda", help="the device the state lives on (default cuda)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import torch

    if args.repeats < 1:
        raise SystemExit("--repeats: must be at least 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device: cuda is not available here (torch sees no CUDA device); try --device cpu")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rota-gpu-bench-") as tmp:
        for size in (float(s) for s in args.sizes.split(",")):
            rows.append(measure(size, args.repeats, args.device, Path(tmp)))
    if args.json:
        print(json.dumps({"cases": rows}, indent=2))
        return 0
    print(f"{'STATE':>8} {'DEVICE':>6} {'PAUSE COPY':>11} {'DURABLE':>9} {'TORCH.SAVE':>11} {'x':>5} "
          f"{'RESTORE':>9} {'TORCH.LOAD':>11} {'x':>5}")
    for r in rows:
        print(f"{r['state_mb']:>6g}MB {r['device']:>6} {r['pause_copy_s']:>10.3f}s {r['durable_s']:>8.3f}s "
              f"{r['save_s']:>10.3f}s {r['save_s'] / r['pause_copy_s']:>5.1f} {r['restore_s']:>8.3f}s "
              f"{r['load_s']:>10.3f}s {r['load_s'] / r['restore_s']:>5.1f}")
    print("(medians; x: torch's time over rota's, higher is better; --json has [min, max] of each)")
    return 0
