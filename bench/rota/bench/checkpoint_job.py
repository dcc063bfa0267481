"""The job `rota bench checkpoint` runs: parameters plus Adam state of a given size, on
one or more data-parallel ranks (gloo), checkpointed through rota.runtime, or saved and
loaded with plain torch.save / torch.load as the baseline.

    python -m rota.bench.checkpoint_job --state-mb 500 --ranks 4 [--save PATH | --load PATH]

Each step changes one small slice of the state and reports `step` (rank 0), so the bench
sees "first step done" in the progress file. `--save PATH` waits for the file PATH.go,
then rank 0 writes the state with torch.save (the others wait, as data-parallel
frameworks do) and all exit; `--load PATH` starts from torch.load instead of an image.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import rota.runtime

TENSOR_MB = 64  # the parameters come as tensors of at most this size, like a model's layers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchjob")
    p.add_argument("--state-mb", type=float, required=True, help="parameters + Adam's two moments, in MiB")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--save", type=Path, default=None)
    p.add_argument("--load", type=Path, default=None)
    p.add_argument("--fsync", action="store_true", help="the baseline syncs its file, as the store does with fsync")
    return p.parse_args(argv)


def make_params(state_mb: float, fill: bool, seed: int) -> nn.ParameterList:
    """A third of the state is parameters (Adam keeps two moments of each)."""
    total = max(1, int(state_mb * (1 << 20) / 3 / 4))  # float32 elements
    step = TENSOR_MB * (1 << 20) // 4
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for start in range(0, total, step):
        n = min(step, total - start)
        tensors.append(torch.randn(n, generator=gen) if fill else torch.empty(n))
    return nn.ParameterList([nn.Parameter(t) for t in tensors])


def rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    if args.ranks > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    restoring = bool(os.environ.get("ROTA_RESTORE_DIR")) or args.load is not None
    params = make_params(args.state_mb, fill=not restoring, seed=args.seed)
    opt = torch.optim.Adam(params, lr=1e-3, foreach=False)
    if args.load is not None:
        saved = torch.load(args.load)
        params.load_state_dict(saved["params"])
        opt.load_state_dict(saved["optimizer"])
        start = int(saved["step"])
    ckpt = rota.runtime.Checkpointer(params=params, optimizer=opt, replicated=("params", "optimizer"))
    if args.load is None:
        start = ckpt.restore()
    if not restoring:
        grads = torch.Generator().manual_seed(args.seed + 1)  # the same on every rank: replicas
        for p in params:  # one full Adam step, so both moments exist (random, as in training)
            p.grad = torch.randn(p.shape, generator=grads)
        opt.step()
        opt.zero_grad(set_to_none=True)
    step = start
    while True:
        step += 1
        with torch.no_grad():
            params[0][: 1024].add_(1e-3)  # a step changes a sliver of the state
        if rank == 0:
            rota.runtime.report(step=step)
        if args.save is not None and _agreed(Path(f"{args.save}.go").exists(), args.ranks):
            if rank == 0:
                torch.save({"params": params.state_dict(), "optimizer": opt.state_dict(), "step": step}, args.save)
                if args.fsync:
                    with open(args.save, "rb") as f:
                        os.fsync(f.fileno())
            if args.ranks > 1:
                dist.barrier()
            os._exit(0)  # as a paused job does: no interpreter teardown
        ckpt.safe_point(step)
        time.sleep(0.01)


def _agreed(flag: bool, ranks: int) -> bool:
    """Whether any rank saw the flag: ranks must take the same branch, or their collectives
    (the barrier below, the runtime's at the safe point) would not match."""
    if ranks == 1:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ranks == 1:
        rank_main(0, args, 0)
    else:
        mp.spawn(rank_main, args=(args, free_port()), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
