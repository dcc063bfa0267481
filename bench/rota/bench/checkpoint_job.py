"""The job `rota bench checkpoint` runs: parameters plus Adam state of a given size, on
one or more data-parallel ranks (gloo), checkpointed through rota.runtime, or saved and
loaded with plain torch.save / torch.load as the baseline.

    python -m rota.bench.checkpoint_job --state-mb 500 --ranks 4 [--save PATH | --load PATH]
        [--load-mmap PATH] [--st-save PATH | --st-load PATH] [--dcp-async PATH] [--wait-for FILE]

Each step changes one small slice of the state and reports `step` (rank 0), so the bench
sees "first step done" in the progress file. The first step after any restore or load
(Rota's image or a framework checkpoint alike) first reads every byte of the state on every
rank (`touch_every_byte`): the end point every restore and load is timed to. `--save PATH` waits for the file PATH.go,
then rank 0 writes the state with torch.save (the others wait, as data-parallel
frameworks do) and all exit; `--load PATH` starts from torch.load instead of an image,
`--load-mmap PATH` from torch.load(mmap=True) with the tensors assigned in place (no copy).
`--st-save PATH` / `--st-load PATH` do the same with safetensors (rank 0 writes one flat
file; a load assigns the tensors). `--dcp-save PATH` / `--dcp-async PATH` / `--dcp-load
PATH` use torch.distributed.checkpoint (every rank takes part; replicated tensors are
written once); an async save writes how long it blocked the ranks (the slowest) to PATH.block.
`--wait-for FILE`: a pre-started loader: the interpreter up and its imports done, it writes
FILE.ready and waits for FILE before it starts its ranks and loads.

The ranks are forked from the job's process after its imports (both sides alike), so a
job started by a warm runtime (rota.agent.warm_runtime) starts its ranks warm too.

A restored job's first report carries where its restore's time went (unix times): the
process start (`t_start`: before its imports), `t_restore` (restore() called), `t_ready`
(the image ready to read), `t_loaded` (the state rebuilt and applied); the report itself
is the first step done.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

T_START = time.time()  # before the imports: a restore's breakdown starts here

import torch  # noqa: E402 - timed from the process start
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import rota.runtime  # noqa: E402
from rota.agent.warm_runtime import DEFAULT_PRELOAD  # noqa: E402

# DCP and safetensors are imported where a mode uses them: every other launch (Rota's
# restores and the torch.load baselines alike) pays only for the imports above, which a
# warm runtime (rota.agent.warm_runtime) and the pre-started loader have done already.

TENSOR_MB = 64  # the parameters come as tensors of at most this size, like a model's layers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchjob")
    p.add_argument("--state-mb", type=float, required=True, help="parameters + Adam's two moments, in MiB")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--save", type=Path, default=None)
    p.add_argument("--load", type=Path, default=None)
    p.add_argument("--load-mmap", type=Path, default=None, help="start from torch.load(PATH, mmap=True), assigned")
    p.add_argument("--st-save", type=Path, default=None, help="safetensors: save_file at PATH.go")
    p.add_argument("--st-load", type=Path, default=None, help="start from safetensors' load_file of PATH")
    p.add_argument("--wait-for", type=Path, default=None, help="pre-started: write FILE.ready, wait for FILE")
    p.add_argument("--dcp-save", type=Path, default=None, help="torch.distributed.checkpoint: dcp.save at PATH.go")
    p.add_argument("--dcp-async", type=Path, default=None, help="dcp.async_save at PATH.go (its blocking time: PATH.block)")
    p.add_argument("--dcp-load", type=Path, default=None, help="start from dcp.load of PATH")
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
    loads = (args.load, args.load_mmap, args.st_load, args.dcp_load)
    restoring = bool(os.environ.get("ROTA_RESTORE_DIR")) or any(x is not None for x in loads)
    params = make_params(args.state_mb, fill=not restoring, seed=args.seed)
    opt = torch.optim.Adam(params, lr=1e-3, foreach=False)
    timings: dict[str, float] = {}
    params, opt, start = _load_framework_checkpoint(args, params, opt)
    ckpt = rota.runtime.Checkpointer(params=params, optimizer=opt, replicated=("params", "optimizer"))
    if os.environ.get("ROTA_RESTORE_DIR"):
        timings = {"t_start": T_START, "t_restore": time.time()}
        start = ckpt.restore()
        timings |= {k: v for k, v in ckpt.restore_timings.items() if k.startswith("t_")}
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
            if restoring and step == start + 1:
                touch_every_byte(params, opt, args.ranks)
            params[0][: 1024].add_(1e-3)  # a step changes a sliver of the state
        if rank == 0:
            if timings and "t_step" not in timings:
                timings["t_step"] = time.time()  # the first step done; every report repeats it
            rota.runtime.report(step=step, **timings)
        _save_if_asked(args, rank, params, opt, step)
        ckpt.safe_point(step)
        time.sleep(0.01)


def touch_every_byte(params: nn.ParameterList, opt: torch.optim.Adam, ranks: int) -> float:
    """The first step after a restore or a load reads every byte of the state (parameters
    and both moments, on every rank) before it reports, as a training step reads them: a
    lazily mapped state (torch.load(mmap=True), Rota's mapped image) is restored only once
    its pages are read, so every arm is timed to the same point."""
    total = 0.0
    for p in params:
        total += float(p.sum())
    for entry in opt.state.values():
        for value in entry.values():
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                total += float(value.sum())
    if ranks > 1:
        dist.barrier()  # rank 0 reports once every rank has read its state
    return total


def _load_framework_checkpoint(args: argparse.Namespace, params: nn.ParameterList, opt: torch.optim.Adam,
                               ) -> tuple[nn.ParameterList, torch.optim.Adam, int]:
    """The state from a framework checkpoint, if one is given; the step to go on from."""
    if args.load is not None or args.load_mmap is not None:
        mapped = args.load_mmap is not None
        saved = torch.load(args.load_mmap if mapped else args.load, mmap=mapped)
        params.load_state_dict(saved["params"], assign=mapped)  # mapped: the file's pages, no copy
        opt = torch.optim.Adam(params, lr=1e-3, foreach=False)  # over the assigned parameters
        opt.load_state_dict(saved["optimizer"])
        return params, opt, int(saved["step"])
    if args.st_load is not None:
        return _load_safetensors(args.st_load, params)
    if args.dcp_load is not None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(params, opt)  # fills Adam's moments to load into
        both: dict[str, Any] = {"params": model_state, "optimizer": optim_state, "step": 0}
        dcp.load(both, checkpoint_id=str(args.dcp_load))
        set_state_dict(params, opt, model_state_dict=both["params"], optim_state_dict=both["optimizer"])
        return params, opt, int(both["step"])
    return params, opt, 0


def _save_safetensors(params: nn.ParameterList, opt: torch.optim.Adam, step: int, path: Path) -> None:
    """One flat file: the parameters, Adam's moments and step counts; the groups as metadata."""
    from safetensors.torch import save_file

    state = opt.state_dict()
    flat = {f"params.{k}": v.detach() for k, v in params.state_dict().items()}
    for index, entry in state["state"].items():
        flat |= {f"state.{index}.{name}": value.reshape(-1) if name == "step" else value
                 for name, value in entry.items()}
    meta = {"param_groups": json.dumps(state["param_groups"]), "step": str(step)}
    save_file(flat, str(path), metadata=meta)


def _load_safetensors(path: Path, params: nn.ParameterList) -> tuple[nn.ParameterList, torch.optim.Adam, int]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    flat = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    params.load_state_dict({k.removeprefix("params."): v for k, v in flat.items() if k.startswith("params.")},
                           assign=True)
    opt = torch.optim.Adam(params, lr=1e-3, foreach=False)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        if key.startswith("state."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value.reshape(()) if name == "step" else value
    opt.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    return params, opt, int(meta["step"])


def _save_if_asked(args: argparse.Namespace, rank: int, params: nn.ParameterList, opt: torch.optim.Adam,
                   step: int) -> None:
    """When the bench's `.go` file appears: the framework checkpoint a user would take, then exit."""
    dcp_path = args.dcp_save or args.dcp_async
    if dcp_path is not None and _agreed(Path(f"{dcp_path}.go").exists(), args.ranks):
        save_dcp(params, opt, step, dcp_path, asynchronous=args.dcp_async is not None, fsync=args.fsync,
                 rank=rank, ranks=args.ranks)
        os._exit(0)
    path = args.save or args.st_save
    if path is not None and _agreed(Path(f"{path}.go").exists(), args.ranks):
        if rank == 0:
            if args.save is not None:
                torch.save({"params": params.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
            else:
                _save_safetensors(params, opt, step, path)
            if args.fsync:
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        if args.ranks > 1:
            dist.barrier()
        os._exit(0)  # as a paused job does: no interpreter teardown


def save_dcp(params: nn.ParameterList, opt: torch.optim.Optimizer, step: int, path: Path, *, asynchronous: bool,
             fsync: bool, rank: int, ranks: int) -> None:
    """The framework checkpoint a user would pick instead: every rank calls dcp.save (or
    async_save, whose blocking time is what the job pays) of the same state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(params, opt)
    both = {"params": model_state, "optimizer": optim_state, "step": step}
    if asynchronous:
        began = time.perf_counter()
        future = dcp.async_save(both, checkpoint_id=str(path))
        blocked = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
        if ranks > 1:
            dist.all_reduce(blocked, op=dist.ReduceOp.MAX)
        future.result()  # type: ignore[union-attr]  # a Future unless async_stager asks otherwise
        if rank == 0:
            Path(f"{path}.block").write_text(str(float(blocked.item())))
    else:
        dcp.save(both, checkpoint_id=str(path))
    if fsync and rank == 0:
        os.sync()
    if ranks > 1:
        dist.barrier()


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
    if args.wait_for is not None:
        wait_for(args.wait_for, ("safetensors.torch",) if args.st_load is not None else ())
    if args.ranks == 1:
        rank_main(0, args, 0)
    else:  # forked after the imports, which the ranks share
        mp.start_processes(rank_main, args=(args, free_port()), nprocs=args.ranks, join=True, start_method="fork")
    return 0


def wait_for(path: Path, also: tuple[str, ...] = ()) -> None:
    """A pre-started loader: up, with what a warm runtime imports ahead (no less, so the two
    start level) and its loader's own modules (`also`), waiting for the file it will load."""
    for module in (*DEFAULT_PRELOAD, *also):
        importlib.import_module(module)
    Path(f"{path}.ready").touch()
    while not path.exists():
        time.sleep(0.002)


if __name__ == "__main__":
    sys.exit(main())
