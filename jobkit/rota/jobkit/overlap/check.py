"""Check that every pass keeps a block's outputs, on real gloo ranks.

``check_rank`` runs on one rank of a gloo group (spawned by torch.multiprocessing, by the
integration test, or by ``python -m rota.jobkit.overlap.check --ranks N``): for each block it
compares, on the same inputs, the eager step, the captured graph, the tiled graph, the
reordered graph, the fully bucketed graph and (optionally) the planner's chosen graph, and
writes the largest deviation of each from the captured graph's outputs as JSON.

Tolerance: a pass is correct when ``allclose(out, ref, rtol=RTOL, atol=ATOL)``; tiling may
change floating-point summation order (a kernel blocks differently on fewer rows), the other
passes only move bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

from rota.jobkit.overlap.blocks import BLOCK_NAMES, BlockSize, make_block
from rota.jobkit.overlap.bucketing import bucket, bucket_by_slot
from rota.jobkit.overlap.calibrate import calibrate_comm
from rota.jobkit.overlap.capture import capture_block, collective_kinds, run_graph
from rota.jobkit.overlap.planner import plan_overlap
from rota.jobkit.overlap.reorder import reorder
from rota.jobkit.overlap.tiling import tile

__all__ = ["ATOL", "RTOL", "check_rank", "free_port", "main"]

RTOL = 1e-5
ATOL = 1e-6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _deviation(outs: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> dict[str, float | bool]:
    if len(outs) != len(ref) or any(o.shape != r.shape for o, r in zip(outs, ref, strict=True)):
        return {"max_abs": float("inf"), "close": False}
    return {"max_abs": max(float((o - r).abs().max()) for o, r in zip(outs, ref, strict=True)),
            "close": all(torch.allclose(o, r, rtol=RTOL, atol=ATOL) for o, r in zip(outs, ref, strict=True))}


def check_rank(rank: int, world: int, port: int, out_dir: str, blocks: Sequence[str], ks: Sequence[int],
               size: BlockSize, plan: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    group = dist.group.WORLD
    assert group is not None
    report: dict[str, dict[str, object]] = {}
    try:
        for name in blocks:
            block = make_block(name, group, rank, world, size)
            captured = capture_block(block)
            ref = run_graph(captured.graph, block.inputs)
            eager = tuple(fc.wait_tensor(o) if isinstance(o, fc.AsyncCollectiveTensor) else o
                          for o in block.step(*block.inputs))
            result: dict[str, object] = {"capture": _deviation(eager, ref)}
            for k in ks:
                tiled = tile(captured, k)
                reordered = reorder(tiled)
                slots = bucket_by_slot(reordered)
                result[f"tile{k}"] = _deviation(run_graph(tiled, block.inputs), ref)
                result[f"reorder{k}"] = _deviation(run_graph(reordered, block.inputs), ref)
                result[f"bucket{k}"] = _deviation(run_graph(bucket(reordered, slots), block.inputs), ref)
                result[f"bucket{k}_slots"] = len(slots)
            if plan:
                comm = calibrate_comm(group, collective_kinds(captured.graph), sizes_bytes=(4 << 10, 64 << 10), repeats=2)
                chosen = plan_overlap(captured, group, ks=ks, comm=comm, repeats=1)
                result["plan"] = _deviation(run_graph(chosen.module, block.inputs), ref)
                result["plan_summary"] = chosen.summary()
            report[name] = result
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="check that the overlap passes keep every block's outputs")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--blocks", nargs="+", default=list(BLOCK_NAMES), choices=BLOCK_NAMES)
    parser.add_argument("--k", type=int, nargs="+", default=[2])
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    if args.ranks < 1:
        parser.error(f"--ranks must be at least 1, got {args.ranks}")
    import torch.multiprocessing as mp
    mp.spawn(check_rank, args=(args.ranks, free_port(), args.out, args.blocks, args.k, BlockSize(), True),
             nprocs=args.ranks)
    print(Path(args.out, "rank0.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
