"""A small, real quantization job: int8 weight quantization of a trained MLP, with torch.

It trains a small classifier on a generated task for a few steps, then quantizes every
``nn.Linear`` weight to int8 (symmetric, one scale per output channel, as weight-only
int8 schemes such as bitsandbytes' do), runs the int8 model (int8 weights dequantized on
the fly) and compares it with the float model. One progress report per quantized layer,
and a final one with the accuracies, the size reduction and the worst output error.

    python examples/quantize_lite.py --train-steps 100
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np
import torch
from torch import nn

import rota.runtime


class Int8Linear(nn.Module):
    """A linear layer whose weight is stored as int8 with one float scale per output channel."""

    qweight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        self.register_buffer("qweight", torch.round(w / scale).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.float32))
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.qweight.to(x.dtype) * self.scale
        return nn.functional.linear(x, weight, self.bias)


def make_data(
    gen: torch.Generator, n: int, dim: int, classes: int, centers: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, classes, (n,), generator=gen)
    x = centers[labels] + torch.randn(n, dim, generator=gen)
    return x, labels


def size_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.inference_mode():
        return float((model(x).argmax(dim=1) == y).float().mean().item())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="int8 weight quantization of a small MLP")
    p.add_argument("--train-steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.train_steps < 1:
        p.error("--train-steps must be at least 1")

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(rota.runtime.job_context().device())
    t0 = time.perf_counter()

    gen = torch.Generator().manual_seed(args.seed)
    centers = 0.35 * torch.randn(args.classes, args.dim, generator=gen)
    model = nn.Sequential(
        nn.Linear(args.dim, args.hidden),
        nn.GELU(),
        nn.Linear(args.hidden, args.hidden),
        nn.GELU(),
        nn.Linear(args.hidden, args.classes),
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(args.train_steps):
        x, y = make_data(gen, 128, args.dim, args.classes, centers)
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(f"quantize_lite: trained {args.train_steps} steps, loss {loss.item():.4f}", flush=True)

    x_eval, y_eval = make_data(gen, 2048, args.dim, args.classes, centers)
    x_eval, y_eval = x_eval.to(device), y_eval.to(device)
    model.eval()
    acc_fp32 = accuracy(model, x_eval, y_eval)

    quantized = nn.Sequential(*[m for m in model])
    layers = [i for i, m in enumerate(quantized) if isinstance(m, nn.Linear)]
    for n, i in enumerate(layers, start=1):
        layer = quantized[i]
        assert isinstance(layer, nn.Linear)
        q = Int8Linear(layer)
        err = float((q.qweight.float() * q.scale - layer.weight.detach()).abs().max().item())
        quantized[i] = q
        rota.runtime.report(step=n, layers=len(layers), max_weight_error=err)
        print(
            f"quantize_lite: layer {n}/{len(layers)} {tuple(layer.weight.shape)} max weight error {err:.2e}",
            flush=True,
        )

    acc_int8 = accuracy(quantized, x_eval, y_eval)
    with torch.inference_mode():
        out_err = float((quantized(x_eval) - model(x_eval)).abs().max().item())
    fp32_size, int8_size = size_bytes(model), size_bytes(quantized)
    rota.runtime.report(
        step=len(layers),
        layers=len(layers),
        accuracy_fp32=acc_fp32,
        accuracy_int8=acc_int8,
        size_ratio=int8_size / fp32_size,
        max_output_error=out_err,
    )
    print(
        f"quantize_lite: accuracy fp32 {acc_fp32:.4f} int8 {acc_int8:.4f}; size {fp32_size} -> {int8_size} bytes "
        f"({int8_size / fp32_size:.2f}x); max output error {out_err:.2e}; {time.perf_counter() - t0:.1f}s",
        flush=True,
    )
    if abs(acc_fp32 - acc_int8) > 0.05:
        raise RuntimeError(f"int8 accuracy {acc_int8:.4f} is far below fp32 {acc_fp32:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
