"""Data-parallel training with torch.distributed (gloo, on the CPU): two ranks, one job.

Each rank trains the same small MLP regressor on its own shard of a synthetic task
(``y = sin(x @ w)`` plus noise); DistributedDataParallel averages the gradients, so the
ranks hold identical parameters and optimizer state: declared ``replicated``, each rank
copies half of them at a pause, and the image holds them once. Every rank registers its state with ``rota.runtime.Checkpointer`` and calls its
safe point after each step: a pause stops both ranks at the same step (or neither), and a
resumed run's losses are bit-identical to an uninterrupted run's. Rank 0 reports progress
and, with ``--losses FILE``, appends the exact mean loss of every step.

    python examples/train_ddp.py --steps 200 --seed 7 --ranks 2

Started by torchrun, or as a Rota gang (a job of `nodes: 2`, `gpus_per_node: 2`), it finds
RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT set and runs as that one rank (`--ranks` is
then WORLD_SIZE). `--single-process` is the reference: one process computes every rank's
shard in turn and averages their gradients, which is what DDP does across processes.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import rota.runtime


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--ranks", type=int, default=2, help="processes (data-parallel ranks)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--report-every", type=int, default=10)
    p.add_argument("--losses", default=None, help="rank 0 appends 'step loss' (exact repr) for every step")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long after each step (demos, tests)")
    p.add_argument("--single-process", action="store_true",
                   help="the reference: every rank's shard in one process, gradients averaged")
    args = p.parse_args(argv)
    if args.steps < 1 or args.ranks < 1:
        p.error("--steps and --ranks must be at least 1")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_batch(gen: torch.Generator, w: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, w.shape[0], generator=gen)
    y = torch.sin(x @ w) + 0.05 * torch.randn(batch, 1, generator=gen)
    return x, y


def rank_main(rank: int, args: argparse.Namespace, port: int, init_method: str = "") -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method or f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.ranks)
    try:
        torch.manual_seed(args.seed)  # the same initial model on every rank
        random.seed(args.seed + rank)
        np.random.seed(args.seed + rank)
        w = torch.randn(args.features, 1, generator=torch.Generator().manual_seed(args.seed))
        model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
        ddp = DistributedDataParallel(model)
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
        gen = torch.Generator().manual_seed(args.seed * 1000 + rank)  # this rank's data shard
        # The model and the optimizer are replicas (DDP): each rank copies half of them.
        ckpt = rota.runtime.Checkpointer(model=model, optimizer=opt, data=gen, replicated=("model", "optimizer"))
        start = ckpt.restore()
        if start and rank == 0:
            print(f"train_ddp: resumed from a checkpoint at step {start}", flush=True)
        for step in range(start + 1, args.steps + 1):
            x, y = make_batch(gen, w, args.batch_size)
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            value = float(mean.item()) / args.ranks
            if rank == 0:
                if args.losses:
                    with open(args.losses, "a", encoding="utf-8") as f:
                        f.write(f"{step} {value!r}\n")
                if step % args.report_every == 0 or step == args.steps:
                    rota.runtime.report(step=step, loss=value)
                    print(f"step {step}/{args.steps} loss {value:.5f}", flush=True)
            if args.step_delay:
                time.sleep(args.step_delay)
            ckpt.safe_point(step)
        dist.barrier()  # every rank done before any tears its connections down
        dist.destroy_process_group()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Skip the interpreter's teardown: with gloo on the CPU it sometimes aborts (SIGABRT,
    # "terminate called without an active exception") after all the work is done.
    sys.stdout.flush()
    os._exit(0)


def single_process(args: argparse.Namespace) -> None:
    """Every rank's step in one process: the same model, shards and averaged gradients."""
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    w = torch.randn(args.features, 1, generator=torch.Generator().manual_seed(args.seed))
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gens = [torch.Generator().manual_seed(args.seed * 1000 + r) for r in range(args.ranks)]
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for gen in gens:  # each rank's loss over its own shard, its gradient a share of the mean
            x, y = make_batch(gen, w, args.batch_size)
            loss = nn.functional.mse_loss(model(x), y)
            (loss / args.ranks).backward()
            total += float(loss.detach())
        opt.step()
        if args.losses:
            with open(args.losses, "a", encoding="utf-8") as f:
                f.write(f"{step} {total / args.ranks!r}\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.single_process:
        single_process(args)
        return 0
    if {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= set(os.environ):  # torchrun, or a Rota gang
        args.ranks = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        if rank == 0:
            print(f"train_ddp: rank 0 of {args.ranks} (gloo, {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']})",
                  flush=True)
        rank_main(rank, args, 0, init_method="env://")
        return 0
    print(f"train_ddp: {args.ranks} ranks (gloo), steps={args.steps} seed={args.seed} pid={os.getpid()}", flush=True)
    mp.spawn(rank_main, args=(args, free_port()), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
