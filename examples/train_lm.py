"""A real (small) PyTorch training job: a causal transformer language model on generated tokens.

The data is a deterministic synthetic task with structure to learn: every sequence is an
arithmetic progression modulo the vocabulary, ``x[t+1] = (x[t] + d) mod V``, with a random
start and a random stride ``d`` per sequence. After two tokens the rest of the sequence is
predictable, so the loss falls from ``ln V`` towards the floor of the two unpredictable
positions. Seeds are fixed, so a run is reproducible.

Progress goes through ``rota.runtime.report(step=..., loss=...)`` every ``--report-every``
steps and at the end (the last report has ``step == --steps``); loss lines go to stdout.

The job can be paused, resumed and migrated: it registers its model, optimizer, LR
schedule and data generator with ``rota.runtime.Checkpointer`` and calls its safe point
after every step; a resumed run continues from the image's step, and its losses are
bit-identical to an uninterrupted run's (``--losses FILE`` appends every step's exact loss).

    python examples/train_lm.py --steps 300 --seed 7
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time

import numpy as np
import torch
from torch import nn

import rota.runtime


class TinyLM(nn.Module):
    """Token + position embeddings, a causal ``nn.TransformerEncoder``, a linear head."""

    mask: torch.Tensor

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model=d_model,
            nhead=heads,
            dim_feedforward=2 * d_model,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False
        )
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:, :n]
        mask = self.mask[:n, :n]
        h = self.encoder(h, mask=mask, is_causal=True)
        logits: torch.Tensor = self.head(self.norm(h))
        return logits


def make_batch(gen: torch.Generator, batch: int, seq_len: int, vocab: int, max_stride: int) -> torch.Tensor:
    """``batch`` arithmetic progressions mod ``vocab`` of ``seq_len + 1`` tokens."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, max_stride + 1, (batch, 1), generator=gen)
    t = torch.arange(seq_len + 1).unsqueeze(0)
    return (start + stride * t) % vocab


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    p.add_argument("--seed", type=int, default=7, help="seed for torch, random and numpy (default 7)")
    p.add_argument("--report-every", type=int, default=10, help="report progress every K steps (default 10)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--max-stride", type=int, default=8)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--device", default=None, help="override the device (default: from rota.runtime)")
    p.add_argument("--losses", default=None, help="append 'step loss' (exact repr) for every step to this file")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long after each step (demos, tests)")
    args = p.parse_args(argv)
    for name in ("steps", "report_every", "batch_size", "seq_len", "vocab", "max_stride", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.threads)

    ctx = rota.runtime.job_context()
    device = torch.device(args.device or ctx.device())
    print(
        f"train_lm: job={ctx.job_id or '-'} node={ctx.node or '-'} gpus={list(ctx.gpus)} "
        f"device={device} steps={args.steps} seed={args.seed}",
        flush=True,
    )

    model = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq_len).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, min(20, args.steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, s / max(1, args.steps))))
        ),
    )
    gen = torch.Generator().manual_seed(args.seed)
    loss_fn = nn.CrossEntropyLoss()
    # Everything a resumed run needs to continue exactly where this one stopped.
    ckpt = rota.runtime.Checkpointer(model=model, optimizer=opt, scheduler=sched, data=gen)
    start = ckpt.restore()
    if start:
        print(f"train_lm: resumed from a checkpoint at step {start}", flush=True)

    t0 = time.perf_counter()
    loss_value = float("nan")
    for step in range(start + 1, args.steps + 1):
        seq = make_batch(gen, args.batch_size, args.seq_len, args.vocab, args.max_stride).to(device)
        inputs, targets = seq[:, :-1], seq[:, 1:]
        logits = model(inputs)
        loss = loss_fn(logits.reshape(-1, args.vocab), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = float(loss.item())
        if not math.isfinite(loss_value):
            raise RuntimeError(f"loss is not finite at step {step}: {loss_value}")
        if args.losses:
            with open(args.losses, "a", encoding="utf-8") as f:
                f.write(f"{step} {loss_value!r}\n")
        if step % args.report_every == 0 or step == args.steps:
            rota.runtime.report(step=step, loss=loss_value)
            print(f"step {step}/{args.steps} loss {loss_value:.4f}", flush=True)
        if args.step_delay:
            time.sleep(args.step_delay)
        ckpt.safe_point(step)

    elapsed = time.perf_counter() - t0
    done = args.steps - start
    print(
        f"done: {done} steps in {elapsed:.1f}s ({done / max(elapsed, 1e-9):.1f} steps/s), "
        f"final loss {loss_value:.4f} (chance {math.log(args.vocab):.4f})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
