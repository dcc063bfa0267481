"""A small, real batch-inference job: a transformer encoder classifies batches of generated tokens.

It builds a small model with a fixed seed, runs it under ``torch.inference_mode`` over
``--batches`` batches, reports progress after each batch (items done, throughput) and
prints a checksum of the predictions, so two runs with the same seed can be compared.
``--output FILE`` writes the predictions as JSON lines.

    python examples/batch_infer.py --batches 100 --batch-size 64
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time

import numpy as np
import torch
from torch import nn

import rota.runtime


class Classifier(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 2 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens))
        logits: torch.Tensor = self.head(h.mean(dim=1))
        return logits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="batch inference with a small transformer")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=None, help="write predictions as JSON lines to this file")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(rota.runtime.job_context().device())

    model = Classifier(args.vocab, 64, 2, 4, args.classes).to(device).eval()
    gen = torch.Generator().manual_seed(args.seed)
    digest = hashlib.sha256()
    counts = [0] * args.classes
    out = open(args.output, "w", encoding="utf-8") if args.output else None
    t0 = time.perf_counter()
    done = 0
    try:
        with torch.inference_mode():
            for batch in range(1, args.batches + 1):
                tokens = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), generator=gen).to(
                    device
                )
                preds = model(tokens).argmax(dim=1).cpu().tolist()
                done += len(preds)
                for c in preds:
                    counts[c] += 1
                digest.update(json.dumps(preds).encode())
                if out is not None:
                    out.write(json.dumps({"batch": batch, "predictions": preds}) + "\n")
                elapsed = time.perf_counter() - t0
                rota.runtime.report(step=batch, batches=args.batches, items=done, items_per_s=done / elapsed)
                print(
                    f"batch_infer: batch {batch}/{args.batches} items {done} ({done / elapsed:.0f}/s)",
                    flush=True,
                )
    finally:
        if out is not None:
            out.close()
    print(
        f"batch_infer: {done} items in {time.perf_counter() - t0:.2f}s; classes {counts}; "
        f"sha256 {digest.hexdigest()[:16]}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
