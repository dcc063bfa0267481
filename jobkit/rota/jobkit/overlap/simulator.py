"""A graph simulator on two resources (compute, communication), on plain data (no torch).

A schedule is a list of :class:`SimOp` in program order. The compute resource runs ops one
after another in that order; a collective is *issued* by the compute resource (a short launch
cost) and then occupies the communication resource, which serves collectives first come, first
served, for ``comm_s`` (α + β·bytes, from :class:`CommModel`); a *wait* blocks the compute
resource until its collective is done. Makespan is when both resources are idle.

Memory follows tensor lifetimes the way an FX graph frees them: an op's output is allocated
when the op runs and freed after the last op that reads it, or any view of it (``alias_of``);
graph inputs and outputs live throughout. The peak is the largest sum of live bytes at any op.

Bucketing is also here, on the same data: :func:`apply_buckets` merges collectives into one
(pack, one collective, unpack) and :func:`choose_buckets` picks the merges by dynamic
programming over the collectives in issue order, minimising simulated makespan within a peak
memory budget. :func:`decide` is the planner's rule: refuse what is predicted slower or over
budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["CommModel", "Decision", "SimOp", "SimResult", "apply_buckets", "bucket_candidates", "choose_buckets",
           "decide", "simulate"]

KINDS = ("input", "compute", "issue", "wait")


@dataclass(frozen=True)
class SimOp:
    """One op of a schedule.

    ``kind``: ``input`` (graph input), ``compute``, ``issue`` (starts a collective), ``wait``
    (blocks until the collective named in ``inputs[0]`` is done; its output is that
    collective's). ``cost_s`` is time on the compute resource; ``comm_s`` (issue only) time on
    the communication resource. ``out_bytes`` is what the op newly allocates; ``alias_of``
    names the tensor its output is a view of. ``collective`` (issue only) is the key of what
    it may merge with (kind and parameters); ``comm_bytes`` the bytes it sends and
    ``unpack_copies`` whether splitting a merged result needs a copy (a strided gather) or
    is only views.
    """

    name: str
    kind: str
    inputs: tuple[str, ...] = ()
    cost_s: float = 0.0
    comm_s: float = 0.0
    out_bytes: int = 0
    alias_of: str | None = None
    stream: int | None = None
    collective: str | None = None
    comm_bytes: int = 0
    unpack_copies: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.cost_s < 0 or self.comm_s < 0 or self.out_bytes < 0 or self.comm_bytes < 0:
            raise ValueError(f"op {self.name!r}: cost_s, comm_s, out_bytes and comm_bytes must be >= 0")
        if self.kind == "wait" and len(self.inputs) != 1:
            raise ValueError(f"op {self.name!r}: a wait takes exactly one input (its collective)")


@dataclass(frozen=True)
class SimResult:
    makespan_s: float
    peak_bytes: int
    compute_busy_s: float
    comm_busy_s: float


@dataclass(frozen=True)
class CommModel:
    """Collective time ``alpha_s + beta_s_per_byte * bytes`` per collective kind, and copy speed."""

    alpha_s: Mapping[str, float]
    beta_s_per_byte: Mapping[str, float]
    copy_s_per_byte: float = 1e-10
    launch_s: float = 0.0

    def time(self, kind: str, nbytes: int) -> float:
        if kind not in self.alpha_s or kind not in self.beta_s_per_byte:
            raise ValueError(f"comm model: no α/β for collective kind {kind!r}")
        return max(0.0, self.alpha_s[kind] + self.beta_s_per_byte[kind] * nbytes)


def _check_schedule(ops: Sequence[SimOp]) -> None:
    seen: set[str] = set()
    kinds: dict[str, str] = {}
    for op in ops:
        if op.name in seen:
            raise ValueError(f"schedule: op name {op.name!r} appears twice")
        for name in op.inputs:
            if name not in seen:
                raise ValueError(f"schedule: op {op.name!r} reads {name!r} before it is produced")
        if op.kind == "wait" and kinds[op.inputs[0]] != "issue":
            raise ValueError(f"schedule: wait {op.name!r} waits on {op.inputs[0]!r}, which is not a collective")
        if op.alias_of is not None and op.alias_of not in seen:
            raise ValueError(f"schedule: op {op.name!r} is a view of {op.alias_of!r}, not yet produced")
        seen.add(op.name)
        kinds[op.name] = op.kind


def peak_memory(ops: Sequence[SimOp], outputs: Sequence[str] = ()) -> int:
    """The largest sum of live bytes at any op, by tensor lifetimes (views keep their base alive)."""
    base: dict[str, str] = {}
    for op in ops:
        base[op.name] = base[op.alias_of] if op.alias_of is not None else op.name
    last_use = _last_uses(ops, outputs, base)
    frees: dict[int, int] = {}
    for op in ops:
        if op.out_bytes and base[op.name] == op.name:
            frees[last_use[op.name]] = frees.get(last_use[op.name], 0) + op.out_bytes
    live = peak = 0
    for i, op in enumerate(ops):
        live += op.out_bytes if base[op.name] == op.name else 0
        peak = max(peak, live)
        live -= frees.get(i, 0)
    return peak


def _last_uses(ops: Sequence[SimOp], outputs: Sequence[str], base: dict[str, str]) -> dict[str, int]:
    """The index of the last op that reads each base tensor (or a view of it); the schedule's
    end for its outputs and inputs, which stay live throughout."""
    end = len(ops)
    last_use: dict[str, int] = {}
    for i, op in enumerate(ops):
        last_use.setdefault(base[op.name], i)
        for name in op.inputs:
            last_use[base[name]] = max(last_use[base[name]], i)
        if op.alias_of is not None:
            last_use[base[op.name]] = max(last_use[base[op.name]], i)
    for name in outputs:
        last_use[base[name]] = end
    for op in ops:
        if op.kind == "input":
            last_use[op.name] = end
    return last_use


def simulate(ops: Sequence[SimOp], outputs: Sequence[str] = ()) -> SimResult:
    """Predict makespan and peak memory of ``ops`` run in order on compute and communication."""
    _check_schedule(ops)
    ready: dict[str, float] = {}
    compute_free = comm_free = 0.0
    compute_busy = comm_busy = 0.0
    for op in ops:
        inputs_ready = max((ready[n] for n in op.inputs), default=0.0)
        if op.kind == "input":
            ready[op.name] = 0.0
        elif op.kind == "compute":
            compute_free = max(compute_free, inputs_ready) + op.cost_s
            compute_busy += op.cost_s
            ready[op.name] = compute_free
        elif op.kind == "issue":
            compute_free = max(compute_free, inputs_ready) + op.cost_s
            compute_busy += op.cost_s
            comm_free = max(comm_free, compute_free) + op.comm_s
            comm_busy += op.comm_s
            ready[op.name] = comm_free
        else:
            compute_free = max(compute_free, ready[op.inputs[0]])
            ready[op.name] = compute_free
    return SimResult(max(compute_free, comm_free), peak_memory(ops, outputs), compute_busy, comm_busy)


def _bucket_errors(ops: Sequence[SimOp], bucket: Sequence[str]) -> str | None:
    """Why ``bucket`` cannot merge into one collective, or None when it can."""
    position = {op.name: i for i, op in enumerate(ops)}
    by_name = {op.name: op for op in ops}
    for name in bucket:
        if name not in by_name or by_name[name].kind != "issue":
            return f"{name!r} is not a collective of the schedule"
    keys = {by_name[n].collective for n in bucket}
    if None in keys or len(keys) != 1:
        return f"collectives {list(bucket)} are not compatible (kinds or parameters differ)"
    waits = [i for i, op in enumerate(ops) if op.kind == "wait" and op.inputs[0] in bucket]
    last_issue = max(position[n] for n in bucket)
    if len(waits) != len(bucket) or min(waits) < last_issue:
        return f"collectives {list(bucket)}: one is waited on before the last is issued"
    return None


def apply_buckets(ops: Sequence[SimOp], buckets: Sequence[Sequence[str]], comm: CommModel) -> list[SimOp]:
    """The schedule with each bucket (two or more collectives) merged into one.

    The merged collective is issued where its last member was (after a pack copy of all the
    members' inputs) and waited on where its first member was waited on; each member's wait is
    then an unpack (a view, or a copy when ``unpack_copies``) of the merged result.
    """
    members = _bucket_members(ops, buckets)
    by_name = {op.name: op for op in ops}
    last = {b: max(bucket, key=lambda n: [o.name for o in ops].index(n)) for b, bucket in enumerate(buckets)
            if len(bucket) >= 2}
    waited: set[int] = set()
    out: list[SimOp] = []
    for op in ops:
        if op.kind == "issue" and op.name in members:
            b = members[op.name]
            if op.name == last[b]:
                out += _merged_issue(op, b, [by_name[n] for n in buckets[b]], comm)
            continue
        if op.kind == "wait" and op.inputs[0] in members:
            b = members[op.inputs[0]]
            if b not in waited:
                waited.add(b)
                out += _merged_wait(ops, b, [by_name[n] for n in buckets[b]], comm)
            continue
        out.append(op)
    return out


def _bucket_members(ops: Sequence[SimOp], buckets: Sequence[Sequence[str]]) -> dict[str, int]:
    """Each bucketed collective's bucket, every bucket checked mergeable and disjoint from the others."""
    members: dict[str, int] = {}
    for b, bucket in enumerate(buckets):
        if len(bucket) < 2:
            continue
        error = _bucket_errors(ops, bucket)
        if error:
            raise ValueError(f"bucket {b}: {error}")
        for name in bucket:
            if name in members:
                raise ValueError(f"bucket {b}: collective {name!r} is already in bucket {members[name]}")
            members[name] = b
    return members


def _merged_issue(op: SimOp, b: int, merged: list[SimOp], comm: CommModel) -> list[SimOp]:
    """Bucket b's pack copy and its one collective, issued where its last member `op` was."""
    total_in = sum(m.comm_bytes for m in merged)
    kind = (op.collective or "").split("|")[0]
    pack = f"bucket{b}_pack"
    return [
        SimOp(pack, "compute", tuple(i for m in merged for i in m.inputs),
              cost_s=comm.copy_s_per_byte * total_in, out_bytes=total_in),
        SimOp(f"bucket{b}", "issue", (pack,), cost_s=comm.launch_s, comm_s=comm.time(kind, total_in),
              out_bytes=sum(m.out_bytes for m in merged), collective=op.collective,
              comm_bytes=total_in, unpack_copies=op.unpack_copies),
    ]


def _merged_wait(ops: Sequence[SimOp], b: int, merged: list[SimOp], comm: CommModel) -> list[SimOp]:
    """Bucket b's one wait, then each member's wait as an unpack (a view, or a copy)."""
    out = [SimOp(f"bucket{b}_wait", "wait", (f"bucket{b}",), alias_of=f"bucket{b}")]
    for m in merged:
        wait_name = next(w.name for w in ops if w.kind == "wait" and w.inputs[0] == m.name)
        if m.unpack_copies:
            out.append(SimOp(wait_name, "compute", (f"bucket{b}_wait",),
                             cost_s=comm.copy_s_per_byte * m.out_bytes, out_bytes=m.out_bytes,
                             stream=m.stream))
        else:
            out.append(SimOp(wait_name, "compute", (f"bucket{b}_wait",), alias_of=f"bucket{b}_wait",
                             stream=m.stream))
    return out


def bucket_candidates(ops: Sequence[SimOp]) -> list[str]:
    """The collectives of the schedule in issue order: the sequence the DP partitions."""
    return [op.name for op in ops if op.kind == "issue"]


@dataclass(frozen=True)
class BucketChoice:
    buckets: tuple[tuple[str, ...], ...]
    result: SimResult


def choose_buckets(ops: Sequence[SimOp], comm: CommModel, budget_bytes: int | None, outputs: Sequence[str] = (),
                   max_bucket: int | None = None) -> BucketChoice:
    """Merge runs of consecutive (in issue order) compatible collectives, chosen by DP.

    ``best[i]`` is the best bucketing of the first ``i`` collectives (the rest left alone),
    scored by the simulated makespan of the whole schedule; ``best[i]`` extends some
    ``best[j]`` by the run ``j..i`` as one bucket. A choice whose simulated peak exceeds
    ``budget_bytes`` is never taken. Leaving everything alone is always a candidate, so the
    result is never predicted slower than no bucketing.
    """
    order = bucket_candidates(ops)
    limit = max_bucket or len(order)
    best: list[tuple[tuple[str, ...], ...] | None] = [None] * (len(order) + 1)
    score: list[tuple[float, int]] = [(float("inf"), 0)] * (len(order) + 1)
    best[0] = ()
    base = simulate(ops, outputs)
    score[0] = (base.makespan_s, base.peak_bytes)
    for i in range(1, len(order) + 1):
        for j in range(max(0, i - limit), i):
            prefix = best[j]
            if prefix is None:
                continue
            run = tuple(order[j:i])
            if len(run) >= 2 and _bucket_errors(ops, run):
                continue
            plan = prefix + ((run,) if len(run) >= 2 else ())
            result = simulate(apply_buckets(ops, plan, comm), outputs)
            if budget_bytes is not None and result.peak_bytes > budget_bytes:
                continue
            if (result.makespan_s, result.peak_bytes) < score[i]:
                best[i], score[i] = plan, (result.makespan_s, result.peak_bytes)
    chosen = best[len(order)] if best[len(order)] is not None else ()
    assert chosen is not None
    return BucketChoice(chosen, simulate(apply_buckets(ops, chosen, comm), outputs))


@dataclass(frozen=True)
class Decision:
    """The planner's pick among candidate transformations, and why the others were refused."""

    chosen: str
    result: SimResult
    refused: dict[str, str] = field(default_factory=dict)


def decide(baseline: SimResult, candidates: Mapping[str, SimResult], budget_bytes: int | None) -> Decision:
    """Keep the untransformed graph unless a candidate is predicted faster and within budget."""
    refused: dict[str, str] = {}
    chosen, best = "untransformed", baseline
    for label, result in candidates.items():
        if budget_bytes is not None and result.peak_bytes > budget_bytes:
            refused[label] = f"predicted peak {result.peak_bytes} B over the budget of {budget_bytes} B"
        elif result.makespan_s >= baseline.makespan_s:
            refused[label] = (f"predicted {result.makespan_s * 1e3:.3f} ms, not faster than the untransformed "
                              f"{baseline.makespan_s * 1e3:.3f} ms")
        elif result.makespan_s < best.makespan_s:
            if chosen != "untransformed":
                refused[chosen] = f"predicted slower than {label}"
            chosen, best = label, result
        else:
            refused[label] = f"predicted slower than {chosen}"
    return Decision(chosen, best, refused)

