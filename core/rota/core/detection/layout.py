"""A job's 3-D parallel layout and one iteration's report, as the runtime sends them (pure).

Ranks are numbered 0 … tp·pp·dp − 1 with tensor parallelism fastest, then pipeline, then
data parallelism: rank = t + tp·(s + pp·d). A report may name another stage for a rank
(`stages`, e.g. an interleaved placement); the replica of a rank always follows the
numbering, because data-parallel replicas are whole pipelines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rota.core.errors import InvalidArgument

MAX_RANKS = 1 << 14
MAX_MICROBATCHES = 1024  # per replica and iteration


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    stages: tuple[int, ...] = ()  # stage of each rank; empty = by the numbering

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"layout.{name}", f"must be a positive integer (got {value!r})")
        if self.ranks > MAX_RANKS:
            raise InvalidArgument("layout", f"{self.ranks} ranks; at most {MAX_RANKS}")
        if self.stages:
            if len(self.stages) != self.ranks:
                raise InvalidArgument("layout.stages", f"names {len(self.stages)} ranks; the layout has {self.ranks}")
            if any(not 0 <= s < self.pp for s in self.stages):
                raise InvalidArgument("layout.stages", f"a stage outside 0..{self.pp - 1}")

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, t: int, s: int, d: int) -> int:
        return t + self.tp * (s + self.pp * d)

    def stage(self, rank: int) -> int:
        return self.stages[rank] if self.stages else rank // self.tp % self.pp

    def replica(self, rank: int) -> int:
        return rank // (self.tp * self.pp)

    def tp_index(self, rank: int) -> int:
        return rank % self.tp

    def group(self, stage: int, replica: int) -> list[int]:
        """The ranks that hold `stage` in `replica`: one tensor-parallel group."""
        first = replica * self.tp * self.pp
        return [r for r in range(first, first + self.tp * self.pp) if self.stage(r) == stage]

    def base(self) -> Layout:
        """The same sizes without a custom stage map (what re-plans start from)."""
        return Layout(self.tp, self.pp, self.dp)

    def as_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp}


MicroBatch = tuple[int, ...]  # the sequence lengths packed into one micro-batch


@dataclass(frozen=True)
class IterationReport:
    """One training iteration as the job saw it.

    `rank_seconds[r]` is rank r's busy (compute) time in the iteration, None when rank r did
    not report; `micro_batches[d]` are replica d's micro-batches in schedule order; and
    `iteration_seconds` is the wall time of the whole step (0 when unknown), and
    `predicted_seconds` the step time the job expects before any is measured (a simulator's
    prediction, e.g. of an overlap plan; 0 when none).
    """

    iteration: int
    layout: Layout
    rank_seconds: tuple[float | None, ...]
    micro_batches: tuple[tuple[MicroBatch, ...], ...]
    iteration_seconds: float = 0.0
    predicted_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.iteration < 0:
            raise InvalidArgument("iteration", f"must be at least 0 (got {self.iteration})")
        if len(self.rank_seconds) != self.layout.ranks:
            raise InvalidArgument("rank_seconds", f"has {len(self.rank_seconds)} values; the layout has "
                                                  f"{self.layout.ranks} ranks")
        if any(s is not None and not s >= 0 for s in self.rank_seconds):  # `not >=` also refuses NaN
            raise InvalidArgument("rank_seconds", "a time is negative or not a number")
        if len(self.micro_batches) != self.layout.dp:
            raise InvalidArgument("micro_batches", f"has {len(self.micro_batches)} replicas; the layout has "
                                                   f"dp={self.layout.dp}")
        if any(not 1 <= len(mbs) <= MAX_MICROBATCHES for mbs in self.micro_batches):
            raise InvalidArgument("micro_batches", f"every replica needs 1..{MAX_MICROBATCHES} micro-batches")
        if any(not mb or any(n < 1 for n in mb) for mbs in self.micro_batches for mb in mbs):
            raise InvalidArgument("micro_batches", "a micro-batch is empty or holds a length below 1")
        if not self.iteration_seconds >= 0:
            raise InvalidArgument("iteration_seconds", "must be at least 0")
        if not 0 <= self.predicted_seconds < float("inf"):
            raise InvalidArgument("predicted_iteration_seconds", "must be a finite time of at least 0")


def flatten(micro_batches: Sequence[Sequence[MicroBatch]]) -> tuple[list[int], list[int], int]:
    """(all lengths, sequences per micro-batch, micro-batches per replica): the wire form."""
    lengths = [n for mbs in micro_batches for mb in mbs for n in mb]
    counts = [len(mb) for mbs in micro_batches for mb in mbs]
    per_replica = {len(mbs) for mbs in micro_batches}
    return lengths, counts, per_replica.pop() if len(per_replica) == 1 else 0


def unflatten(lengths: Sequence[int], counts: Sequence[int], dp: int) -> tuple[tuple[MicroBatch, ...], ...]:
    """The inverse of `flatten`: every replica has the same number of micro-batches."""
    if sum(counts) != len(lengths) or any(c < 1 for c in counts):
        raise InvalidArgument("sequences_per_micro_batch", f"counts add up to {sum(counts)}; "
                                                           f"sequence_lengths has {len(lengths)}")
    if not counts or len(counts) % dp:
        raise InvalidArgument("sequences_per_micro_batch", f"{len(counts)} micro-batches do not split "
                                                           f"evenly over dp={dp} replicas")
    out: list[MicroBatch] = []
    at = 0
    for c in counts:
        out.append(tuple(int(n) for n in lengths[at : at + c]))
        at += c
    m = len(counts) // dp
    return tuple(tuple(out[d * m : (d + 1) * m]) for d in range(dp))
