"""A tensor-parallel MLP step that opts into Rota's overlap planner (gloo, on the CPU).

Each rank holds a column shard of ``w1`` and a row shard of ``w2`` (Megatron style); the step
ends in an all-reduce. ``rota.jobkit.overlap.runtime.apply_overlap`` captures the step, measures
this machine, and runs it tiled, reordered and bucketed when the simulator predicts that
faster within the memory budget (else untransformed); rank 0 reports the plan with every
progress line, so ``rota job ID`` shows ``overlap_k``, ``overlap_buckets``,
``predicted_step_s`` and ``predicted_peak_mb`` beside the measured ``step_s``.

    python examples/overlap_tp_mlp.py --steps 20 --ranks 2

Started by torchrun, or as a Rota gang, it finds RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT
set and runs as that one rank; otherwise it spawns ``--ranks`` processes itself.
``ROTA_OVERLAP=0`` runs the same step untransformed (for comparison).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rota.jobkit.overlap.blocks import BlockSize, make_block
from rota.jobkit.overlap.runtime import apply_overlap


def run_rank(rank: int, world: int, steps: int, size: BlockSize) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    group = dist.group.WORLD
    assert group is not None
    block = make_block("tp_mlp", group, rank, world, size)
    step = apply_overlap(block.step, block.inputs, block.batch_dims, block.out_batch_dims, group)
    times = []
    for i in range(steps):
        dist.barrier(group)
        start = time.perf_counter()
        (out,) = step(*block.inputs)
        times.append(time.perf_counter() - start)
        step.report(step=i + 1, step_s=statistics.median(times), out_norm=float(out.norm()))
    if rank == 0:
        print(f"plan {step.summary()} measured step {statistics.median(times) * 1e3:.2f} ms", flush=True)
    dist.barrier(group)
    dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, steps: int, size: BlockSize) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run_rank(rank, world, steps, size)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--model", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.ranks < 1:
        parser.error(f"--ranks must be at least 1, got {args.ranks}")
    size = BlockSize(batch=args.batch, seq=args.seq, model=args.model, hidden=args.hidden)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.steps, size)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(args.ranks, port, args.steps, size), nprocs=args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
