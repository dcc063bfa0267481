"""A real 4-stage pipeline-parallel transformer that reports every iteration to the failure detector.

    python examples/pipeline_failslow.py --iterations 200 [--layers-per-stage 4,4,4,4] [--pid-dir DIR]

Four stage processes (gloo, ``torch.distributed.pipelining``: ``PipelineStage`` +
``ScheduleGPipe``) train a byte-level causal transformer on the Python standard library's
own sources (shipped with every Python). Each paragraph of a source file (text between
blank lines: a function, a docstring, a run of statements) is one sequence, cut at --seq-max bytes; sequences are packed into
micro-batches of exactly --tokens bytes (the last one cut to fit), and attention runs per
packed sequence, so a micro-batch costs α·tokens + β·Σ lᵢ² like a real packed batch.

Each stage times its own compute edges (forward and backward of each micro-batch, through
``rota.jobkit.tuning.bubbles``). Its busy time is its device's time, as a GPU's CUDA events
would give it: with ``--clock device`` (the default) the CPU time the stage spent inside
those edges plus the time its cgroup's CPU quota held it back (``cpu.stat``: a throttled
stage is a slow device), so other processes competing for the machine's cores do not count;
Both are read at each edge's start and end (``device_clock``), so a hold outside the
edges (in a send, the optimizer) does not count. ``--clock wall`` takes the edges' wall time, which includes them. Stage 0 gathers the busy
times every iteration and calls
``rota.runtime.report_iteration`` with them, the micro-batches' sequence lengths and the
step's wall time. Every stage also beats its own heartbeat (``rota.runtime.heartbeat``)
every --beat seconds from a thread, so a stage that dies goes silent while the others,
blocked on it, keep beating. ``rota.runtime.layout()`` (a re-plan applied by Rota) or
--layers-per-stage sets how many transformer blocks each stage holds.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import socket
import sysconfig
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from pipeline_failslow_state import Batches, StageState, named_parts
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import rota.runtime
from rota.jobkit.tuning.bubbles import BubbleClock, EdgeMarker

STAGES = 4
VOCAB = 256  # bytes


def sequences(seq_max: int) -> list[bytes]:
    """Paragraphs of the standard library's sources, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[bytes] = []
    for path in sorted(root.glob("*.py")):
        for block in path.read_bytes().split(b"\n\n"):
            block = block.strip()
            if len(block) >= 8:
                out.append(block[:seq_max])
    return out


class Block(nn.Module):
    """Pre-norm transformer block; attention runs separately on each packed sequence."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        t, w = x.shape[1], x.shape[2]
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.heads, w // self.heads).permute(1, 2, 0, 3)
        outs, at = [], 0
        for n in lengths:  # cost ∝ n² per sequence: the quadratic term the detector models
            part = slice(at, at + n)
            outs.append(nn.functional.scaled_dot_product_attention(q[:, part], k[:, part], v[:, part], is_causal=True))
            at += n
        att = torch.cat(outs, dim=1).permute(1, 0, 2).reshape(1, t, w)
        x = x + self.proj(att)
        return x + self.mlp(self.norm2(x))


class Stage(nn.Module):
    """One stage's blocks (with the embedding on the first, the head on the last).

    The schedule runs forwards in micro-batch order, so the stage takes each forward's
    sequence lengths from `queue`, which the loop fills every step."""

    def __init__(self, index: int, blocks: int, width: int, heads: int, tokens: int) -> None:
        super().__init__()
        self.first, self.last = index == 0, index == STAGES - 1
        self.embed = nn.Embedding(VOCAB, width) if self.first else None
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(blocks))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, VOCAB)) if self.last else None
        self.queue: list[list[int]] = []
        self.started = False  # the schedule has run a step
        self.tokens = tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lengths = self.queue.pop(0) if x.device.type != "meta" and self.queue else [self.tokens]
        if self.embed is not None:
            x = self.embed(x.long())
        for block in self.blocks:
            x = block(x, lengths)
        return self.head(x) if self.head is not None else x


class FirstStage(nn.Module):
    """The first stage's input is token ids: the edge marker needs a float tensor, so it wraps after the embedding."""

    def __init__(self, stage: Stage, clock: BubbleClock) -> None:
        super().__init__()
        self.embed, stage.embed = stage.embed, None
        self.rest = EdgeMarker(stage, clock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rest(self.embed(x.long()))  # type: ignore[misc]


def throttled_s() -> float:
    """Seconds this process's CPU cgroup has been held back by its quota (0 outside a limited one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if "cpu" in controllers.split(",") or controllers == "":
            base = Path("/sys/fs/cgroup/cpu" if controllers else "/sys/fs/cgroup") / rel.lstrip("/")
            try:
                stat = dict(kv.split() for kv in (base / "cpu.stat").read_text().splitlines())
            except (OSError, ValueError):
                continue
            if "throttled_time" in stat:  # v1, ns
                return int(stat["throttled_time"]) / 1e9
            if "throttled_usec" in stat:  # v2
                return int(stat["throttled_usec"]) / 1e6
    return 0.0


class _Held:
    """Quota holds summed over the cgroups this process has been in."""

    cgroup = ""
    last = 0.0
    total = 0.0


def device_clock() -> float:
    """The stage's device time so far: its CPU time plus the time its quota held it back
    (read at each compute edge, so only holds inside the edges count, as a slow GPU's
    kernels would). A fault harness may move the process to another cgroup between two
    reads: the holds then count from the new cgroup's first read, so the clock never runs back."""
    cgroup = Path("/proc/self/cgroup").read_text()
    held = throttled_s()
    if cgroup == _Held.cgroup:
        _Held.total += max(0.0, held - _Held.last)
    _Held.cgroup, _Held.last = cgroup, held
    return time.process_time() + _Held.total


def _beat(rank: int, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        rota.runtime.heartbeat(rank)


def _split(args: argparse.Namespace) -> list[int]:
    plan = rota.runtime.layout()
    if plan is not None:  # each rank its own stage's layers (a plan may list a moved device at another position)
        by_rank = {int(r): int(st["layers"]) for st in plan["stages"] for r in st["ranks"]}
        return [by_rank.get(r, 0) for r in range(STAGES)]
    return list(args.layers_per_stage)


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.view(-1, VOCAB), target.view(-1).long())


def stage_main(rank: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    if args.pid_dir:
        Path(args.pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
    stop = threading.Event()
    threading.Thread(target=_beat, args=(rank, args.beat, stop), daemon=True).start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=STAGES)
    torch.manual_seed(args.seed + rank)
    split = _split(args)
    clock = BubbleClock(clock=device_clock if args.clock == "device" else time.perf_counter)
    inner = Stage(rank, split[rank], args.width, args.heads, args.tokens)
    # Named before the first stage's wrapper takes the embedding out of `inner`.
    parts = named_parts(inner.blocks, sum(split[:rank]), inner.embed, inner.head)
    module: nn.Module = FirstStage(inner, clock) if rank == 0 else EdgeMarker(inner, clock)
    stage = PipelineStage(module, stage_index=rank, num_stages=STAGES, device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=_loss)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    batches = Batches(sequences(args.seq_max), args.tokens, args.seed)
    state = StageState(parts, optimizer)
    ckpt = rota.runtime.Checkpointer(stage=state, data=batches) if args.checkpoint else None
    if ckpt is not None and os.environ.get("ROTA_RESTORE_DIR"):
        faulthandler.dump_traceback_later(30, repeat=True)  # a restore stuck for 30 s says where, every 30 s
    start = ckpt.restore() if ckpt is not None else 0
    moved = state.take_over() if start else []  # every rank restores the same image: all or none gather
    faulthandler.cancel_dump_traceback_later()
    if rank == 0:
        print(f"starting at iteration {start} with layers {split} per stage"
              + (f" ({'a re-planned' if rota.runtime.layout() else 'its own'} layout)" if args.checkpoint else ""),
              flush=True)
        _log(args, {"start": start, "layers": split, "epoch": rota.runtime.job_context().epoch, "t": time.time()})
    if moved:
        print(f"stage {rank}: took {len(moved)} tensors from other stages' parts ({moved[0]} ...)", flush=True)
    try:
        for step in range(start, args.iterations):
            _step(rank, step, args, schedule, inner, clock, optimizer, batches)
            if ckpt is not None:
                ckpt.safe_point(step + 1)  # a pause exits here; the image holds step + 1, the next to run
    except (RuntimeError, dist.DistBackendError) as exc:  # a peer died: stay up (and beating) until ended
        print(f"stage {rank}: {type(exc).__name__}: {exc}", flush=True)
        time.sleep(args.linger)
        stop.set()
        os._exit(3)
    stop.set()
    dist.barrier()
    dist.destroy_process_group()


def _log(args: argparse.Namespace, line: dict[str, object]) -> None:
    if args.log:
        with open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def _step(rank: int, step: int, args: argparse.Namespace, schedule: ScheduleGPipe, inner: Stage,
          clock: BubbleClock, optimizer: torch.optim.Optimizer, batches: Batches) -> None:
    mbs = [batches.next() for _ in range(args.microbatches)]
    inner.queue = [lengths for lengths, _ in mbs]
    if not inner.started:
        # A schedule's first step first runs the stage once on micro-batch 0's shapes (the
        # pipeline's metadata inference, on real tensors): that call takes an entry too, so
        # each micro-batch gets its own lengths, on a fresh start as after a restore.
        inner.queue.insert(0, inner.queue[0])
        inner.started = True
    started = time.perf_counter()
    first = len(clock.compute)
    losses: list[torch.Tensor] = []
    if rank == 0:
        x = torch.tensor([list(data) for _, data in mbs], dtype=torch.int64).view(args.microbatches, args.tokens)
        schedule.step(x)
    elif rank == STAGES - 1:
        y = torch.tensor([list(data[1:]) + [10] for _, data in mbs], dtype=torch.int64)
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    clock.step_boundary()
    if inner.queue:  # every forward took its entry: else the lengths were misread (a schedule that infers no shapes)
        raise RuntimeError(f"stage {rank}: {len(inner.queue)} micro-batch lengths left unused at step {step}")
    busy = sum(e - s for s, e in clock.compute[first:])
    del clock.compute[:]  # only this step's edges matter
    optimizer.step()
    optimizer.zero_grad()
    loss = float(torch.stack(losses).mean().detach()) if losses else 0.0
    times = [torch.zeros(2, dtype=torch.float64) for _ in range(STAGES)]
    dist.all_gather(times, torch.tensor([busy, loss], dtype=torch.float64))
    wall = time.perf_counter() - started
    if rank == 0:
        rota.runtime.report_iteration(step, rank_seconds=[float(t[0]) for t in times],
                                      micro_batches=[[lengths for lengths, _ in mbs]],
                                      tp=1, pp=STAGES, dp=1, iteration_seconds=wall)
        _log(args, {"step": step, "t": time.time(), "loss": float(times[-1][1]), "wall": wall,
                    "busy": [float(t[0]) for t in times]})


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="4-stage GPipe transformer on packed stdlib sources, reporting iterations")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256, help="bytes per packed micro-batch")
    parser.add_argument("--seq-max", type=int, default=256, help="longest sequence, in bytes")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers-per-stage", type=lambda s: [int(n) for n in s.split(",")], default=[2, 2, 2, 2])
    parser.add_argument("--clock", choices=("device", "wall"), default="device",
                        help="busy time: CPU time plus quota throttling (device), or wall time inside compute edges")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=0, help="the stages' rendezvous port (0: a free one)")
    parser.add_argument("--beat", type=float, default=0.25, help="heartbeat interval per stage, seconds")
    parser.add_argument("--linger", type=float, default=30.0, help="seconds a stage stays up after a peer died")
    parser.add_argument("--pid-dir", default=None, help="write each stage's pid here (rankN.pid), for a fault harness")
    parser.add_argument("--checkpoint", action="store_true",
                        help="register each stage's state with rota.runtime.Checkpointer: pausable, and a restart "
                             "continues from its step (with a re-planned split, blocks move between stages)")
    parser.add_argument("--log", default=None, help="stage 0 appends a JSON line per start and per step (time, loss)")
    args = parser.parse_args(argv)
    for name in ("iterations", "microbatches", "tokens", "seq_max", "width", "heads"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}: must be positive")
    if len(args.layers_per_stage) != STAGES or min(args.layers_per_stage) < 0:
        parser.error(f"--layers-per-stage: give {STAGES} block counts of at least 0")
    if args.width % args.heads:
        parser.error("--width: must be a multiple of --heads")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = int(s.getsockname()[1])
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=stage_main, args=(rank, args)) for rank in range(STAGES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return 1 if any(p.exitcode for p in procs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
