"""What `pipeline_failslow.py` checkpoints, so a restart may split the blocks differently.

A stage registers one `StageState` with ``rota.runtime.Checkpointer``: its parameters and
their optimizer state, named by their place in the whole model (``block.7.qkv.weight``:
the eighth block of the model, whichever stage holds it; ``embed.*`` on the first stage,
``head.*`` on the last), and one `Batches` for the data position. A restore gives each
rank the part it saved; with a re-planned layout (``ROTA_LAYOUT``) a rank may now hold
blocks another rank saved, so after the restore the ranks exchange the table of what each
saved and holds now (`take_over`), and a stage that gained a block receives that block's
weights and optimizer moments from the stage that lost it (gloo send/recv).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def packed(seqs: list[bytes], tokens: int, seed: int) -> Iterator[tuple[list[int], bytes]]:
    """Micro-batches of exactly `tokens` bytes: (sequence lengths, the bytes), shuffled by `seed`."""
    order = list(range(len(seqs)))
    random.Random(seed).shuffle(order)
    lengths: list[int] = []
    data = b""
    while True:
        for i in order:
            s = seqs[i]
            room = tokens - len(data)
            take = s[:room]
            lengths.append(len(take))
            data += take
            if len(data) == tokens:
                yield lengths, data
                lengths, data = [], b""


class Batches:
    """The packed micro-batches as checkpointable state: how many were taken (every stage
    draws the same ones, so each keeps its own count)."""

    def __init__(self, seqs: list[bytes], tokens: int, seed: int) -> None:
        self.seqs, self.tokens, self.seed = seqs, tokens, seed
        self.taken = 0
        self._it = packed(seqs, tokens, seed)

    def next(self) -> tuple[list[int], bytes]:
        self.taken += 1
        return next(self._it)

    def state_dict(self) -> dict[str, Any]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._it = packed(self.seqs, self.tokens, self.seed)
        self.taken = 0
        for _ in range(int(state["taken"])):
            self.next()


def named_parts(blocks: nn.ModuleList, first_block: int, embed: nn.Module | None,
                head: nn.Module | None) -> dict[str, nn.Parameter]:
    """A stage's parameters by their name in the whole model (blocks numbered from `first_block`)."""
    out: dict[str, nn.Parameter] = {}
    for i, block in enumerate(blocks):
        out |= {f"block.{first_block + i}.{n}": p for n, p in block.named_parameters()}
    for prefix, module in (("embed", embed), ("head", head)):
        if module is not None:
            out |= {f"{prefix}.{n}": p for n, p in module.named_parameters()}
    return out


class StageState:
    """A stage's parameters and optimizer moments by model-wide name (see the module doc)."""

    def __init__(self, parts: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
        self.parts, self.optimizer = parts, optimizer
        self.saved: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        # Tensors shared, not copied: the checkpointer copies them into its image.
        params = {n: p.detach() for n, p in self.parts.items()}
        moments = {n: dict(self.optimizer.state[p]) for n, p in self.parts.items() if p in self.optimizer.state}
        return {"params": params, "optimizer": moments}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = state  # applied by take_over, once every rank has its part

    def take_over(self) -> list[str]:
        """Loads this stage's parameters and moments: its own from its restored part, the
        others from the ranks that saved them (a collective: every rank calls it after its
        restore). Only what moved travels, point to point, in one order every rank follows
        (one all-gather of the 10 MB parts hung on gloo in two of four restarts here);
        returns the names this stage took from another rank."""
        if self.saved is None:
            raise RuntimeError("take_over: nothing restored")
        saved = self.saved
        got = _exchange(saved, sorted(self.parts))
        with torch.no_grad():
            for n, p in self.parts.items():
                if n in saved["params"]:
                    p.copy_(saved["params"][n])
                    moments = {k: v.clone() if isinstance(v, torch.Tensor) else v
                               for k, v in saved["optimizer"].get(n, {}).items()}
                else:
                    p.copy_(got[n].pop("param"))
                    moments = got[n]
                if moments:
                    self.optimizer.state[p] = moments
        self.saved = None
        return sorted(got)


def _exchange(saved: dict[str, Any], holds: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """The tensors (parameter and moments by key) of the names this rank holds now but did
    not save, from the ranks that saved them; sends what others need from `saved`."""
    rank = dist.get_rank()
    # Each rank: what it saved (name -> {key: (shape, dtype)}, "param" first) and what it now holds.
    mine = {n: {"param": (tuple(t.shape), str(t.dtype).removeprefix("torch."))} for n, t in saved["params"].items()}
    for n, moments in saved["optimizer"].items():
        mine[n] |= {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in moments.items()
                    if isinstance(v, torch.Tensor)}
    table: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(table, (mine, holds))
    owner = {n: r for r, (had, _) in enumerate(table) for n in had}
    got: dict[str, dict[str, torch.Tensor]] = {}
    for dst, (_, wants) in enumerate(table):
        for n in wants:
            if n not in owner:
                raise RuntimeError(f"the image holds no {n}: the re-planned split needs a block no stage "
                                   "saved (layers changed in total?)")
            src = owner[n]
            if src == dst or rank not in (src, dst):
                continue
            for key, (shape, dtype) in table[src][0][n].items():
                if rank == src:
                    value = saved["params"][n] if key == "param" else saved["optimizer"][n][key]
                    dist.send(value.detach().contiguous(), dst)
                else:
                    buf = torch.empty(shape, dtype=getattr(torch, dtype))
                    dist.recv(buf, src)
                    got.setdefault(n, {})[key] = buf
    return got
