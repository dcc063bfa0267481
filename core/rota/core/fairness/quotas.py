"""Tenant quotas (pure): guaranteed GPUs, a hard limit, borrowing, per-type limits, a tree.

A tenant's quota has three parts (docs/tenants.md):
- `guaranteed`: GPUs it gets back within the reclaim bound whenever it asks for them;
- `limit`: GPUs it never holds more than (None: no cap), its whole subtree counted;
- `type_limits`: per GPU type, GPUs of that type it never holds more than.
A tenant holding more than its guarantee is *borrowing*: only preemptible jobs borrow, so a
borrower can always be paused (checkpointed) to give an owner its guarantee back.
`parent` puts a tenant under another (a department over its groups): the parent's limit
caps the whole subtree; the children's guarantees add up to at most the parent's.

Both the live allocator (`rota.core.planning.planner`) and `rota sim` call `admit` (which
waiting jobs may start without breaking a limit) and `reclaims` (which borrowers to pause
for an owner within its guarantee). No clock, no I/O: plain data in, decisions out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_GPUS = 1_000_000  # above any real cluster: a typo guard for the quota fields
MAX_DEPTH = 8  # levels of the tenant tree


class QuotaError(ValueError):
    """A malformed quota; `field` names it (`guaranteed`, `limit`, `parent`, `gpu_limits[a100]`)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Quota:
    tenant: str
    guaranteed: int = 0
    limit: int | None = None  # None: no cap
    parent: str = ""  # "": a root
    type_limits: tuple[tuple[str, int], ...] = ()  # (GPU type, most GPUs of it), sorted

    @property
    def configured(self) -> bool:
        """Whether any quota rule applies to the tenant itself (a bare tenant has shares only)."""
        return self.guaranteed > 0 or self.limit is not None or bool(self.type_limits)


@dataclass(frozen=True)
class Holding:
    """A running job's GPUs, as the quota rules count them."""

    job_id: str
    tenant: str
    gpus: int
    gpu_type: str = ""  # the type of the GPUs it holds ("": untyped)
    node: str = ""
    movable: bool = False  # preemptible and can continue elsewhere (a checkpoint image, or restarts)
    cost_s: float = 0.0  # what pausing it costs (checkpoint + restore), the price of reclaiming it
    started_s: float = 0.0  # when it last started: the newest borrower goes first among equals


@dataclass(frozen=True)
class Asking:
    """A waiting job."""

    job_id: str
    tenant: str
    gpus: int
    gpu_types: frozenset[str] = frozenset()  # accepted types; empty: any
    preemptible: bool = False


@dataclass
class Admission:
    held: dict[str, str] = field(default_factory=dict)  # job -> why it waits (its reason)
    narrowed: dict[str, frozenset[str]] = field(default_factory=dict)  # job -> the types it may still take


@dataclass(frozen=True)
class Reclaim:
    job_id: str
    tenant: str
    gpus: int
    for_job: str
    for_tenant: str
    reason: str


# Validation.
def check_quota(q: Quota, others: Mapping[str, Quota], cluster_types: Iterable[str] = ()) -> None:
    """Raises QuotaError naming the field when `q` (new or changed) is malformed among `others`
    (every other tenant's quota, by name)."""
    _check_numbers(q)
    for gpu_type, most in q.type_limits:
        if not gpu_type:
            raise QuotaError("gpu_limits", "a GPU type name is empty")
        if most < 0 or most > MAX_GPUS:
            raise QuotaError(f"gpu_limits[{gpu_type}]", f"must be between 0 and {MAX_GPUS} (got {most})")
    del cluster_types  # a type no node has yet is allowed: nodes join later
    tree = {**others, q.tenant: q}
    if q.parent:
        if q.parent == q.tenant:
            raise QuotaError("parent", f"tenant {q.tenant!r} cannot be its own parent")
        if q.parent not in tree:
            raise QuotaError("parent", f"no tenant {q.parent!r}")
        _check_no_cycle(q.tenant, tree)
    for name in {q.tenant, q.parent} - {""}:
        _check_children_fit(tree[name], tree)


def _check_numbers(q: Quota) -> None:
    if q.guaranteed < 0:
        raise QuotaError("guaranteed", f"must not be negative (got {q.guaranteed})")
    if q.guaranteed > MAX_GPUS:
        raise QuotaError("guaranteed", f"at most {MAX_GPUS} (got {q.guaranteed})")
    if q.limit is not None:
        if q.limit < 0:
            raise QuotaError("limit", f"must not be negative (got {q.limit})")
        if q.limit > MAX_GPUS:
            raise QuotaError("limit", f"at most {MAX_GPUS} (got {q.limit})")
        if q.limit < q.guaranteed:
            raise QuotaError("limit", f"{q.limit} is below the guarantee {q.guaranteed}: a limit caps what is guaranteed")


def _check_no_cycle(start: str, tree: Mapping[str, Quota]) -> None:
    seen = [start]
    at = tree[start].parent
    while at:
        if at in seen:
            path = " -> ".join([*seen, at])
            raise QuotaError("parent", f"the tenant tree would have a cycle: {path}")
        seen.append(at)
        if len(seen) > MAX_DEPTH:
            raise QuotaError("parent", f"the tenant tree is deeper than {MAX_DEPTH} levels")
        at = tree[at].parent if at in tree else ""


def _check_children_fit(parent: Quota, tree: Mapping[str, Quota]) -> None:
    """A parent guarantees its subtree: its children's guarantees must fit in its own (when it has one),
    and no child is guaranteed more than the parent's limit."""
    children = [c for c in tree.values() if c.parent == parent.tenant]
    total = sum(c.guaranteed for c in children)
    if parent.guaranteed and total > parent.guaranteed:
        raise QuotaError("guaranteed", f"the children of {parent.tenant!r} are guaranteed {total} GPUs, "
                                       f"more than its own guarantee {parent.guaranteed}")
    for c in children:
        if parent.limit is not None and c.guaranteed > parent.limit:
            raise QuotaError("guaranteed", f"tenant {c.tenant!r} is guaranteed {c.guaranteed}, above its parent "
                                           f"{parent.tenant!r}'s limit {parent.limit}")


# Usage.
class Usage:
    """GPUs each tenant holds, its subtree's, and by type."""

    def __init__(self, quotas: Mapping[str, Quota], running: Iterable[Holding]) -> None:
        self.quotas = quotas
        self.own: dict[str, int] = {}
        self.by_type: dict[tuple[str, str], int] = {}
        for h in running:
            self.add(h.tenant, h.gpus, (h.gpu_type,) if h.gpu_type else ())

    def add(self, tenant: str, gpus: int, types: Iterable[str] = ()) -> None:
        self.own[tenant] = self.own.get(tenant, 0) + gpus
        for t in types:
            self.by_type[tenant, t] = self.by_type.get((tenant, t), 0) + gpus

    def chain(self, tenant: str) -> list[str]:
        """The tenant and its ancestors, nearest first."""
        out = [tenant]
        while len(out) <= MAX_DEPTH and (q := self.quotas.get(out[-1])) is not None and q.parent:
            out.append(q.parent)
        return out

    def subtree(self, tenant: str) -> int:
        return sum(n for t, n in self.own.items() if tenant in self.chain(t))

    def borrowed(self, tenant: str) -> int:
        """GPUs the tenant holds beyond its guarantee (0 without a quota)."""
        q = self.quotas.get(tenant)
        if q is None or not q.configured:
            return 0
        return max(0, self.subtree(tenant) - q.guaranteed)


def standing(quotas: Mapping[str, Quota], running: Iterable[Holding]) -> dict[str, tuple[int, int]]:
    """Tenant -> (GPUs in use by its subtree, GPUs borrowed): what `rota tenants` shows."""
    usage = Usage(quotas, running)
    names = set(quotas) | set(usage.own)
    return {t: (usage.subtree(t), usage.borrowed(t)) for t in sorted(names)}


# Admission.
def admit(quotas: Mapping[str, Quota], running: Iterable[Holding], waiting: Sequence[Asking],
          cluster_types: Iterable[str] = ()) -> Admission:
    """Which waiting jobs (in the order given: the queue's) may be planned without their tenant
    (or an ancestor) going past a limit, counting every job admitted before them as started.
    A job that would take its tenant past its guarantee borrows: only a preemptible one may.
    A per-type limit narrows the types a job may take; none left holds it."""
    usage = Usage(quotas, running)
    types = frozenset(cluster_types)
    out = Admission()
    for w in waiting:
        if not any(quotas.get(t, Quota(t)).configured for t in usage.chain(w.tenant)):
            continue
        why = _over_limit(quotas, usage, w) or _cannot_borrow(quotas, usage, w)
        allowed = w.gpu_types or types
        if why is None and (q := quotas.get(w.tenant)) is not None and q.type_limits:
            allowed, why = _within_type_limits(q, usage, w, allowed)
        if why is not None:
            out.held[w.job_id] = why
            continue
        if allowed != (w.gpu_types or types):
            out.narrowed[w.job_id] = allowed
        usage.add(w.tenant, w.gpus, allowed)
    return out


def limit_reason(quotas: Mapping[str, Quota], held: Mapping[str, int], tenant: str, gpus: int) -> str | None:
    """Why `gpus` more for `tenant` would break a limit (its own or an ancestor's), given the
    GPUs each tenant holds (`held`); None when they fit. What `admit` checks first, for
    callers that keep their own counts (the simulator)."""
    usage = Usage(quotas, ())
    usage.own = dict(held)
    return _over_limit(quotas, usage, Asking("", tenant, gpus, preemptible=True))


def _over_limit(quotas: Mapping[str, Quota], usage: Usage, w: Asking) -> str | None:
    for t in usage.chain(w.tenant):
        q = quotas.get(t)
        if q is None or q.limit is None:
            continue
        used = usage.subtree(t)
        if used + w.gpus > q.limit:
            whose = f"tenant {t}" if t == w.tenant else f"tenant {w.tenant}'s parent {t}"
            return f"waits: {whose} at its limit {q.limit} ({used} GPUs in use; this job needs {w.gpus})"
    return None


def _cannot_borrow(quotas: Mapping[str, Quota], usage: Usage, w: Asking) -> str | None:
    q = quotas.get(w.tenant)
    if q is None or not q.configured or w.preemptible:
        return None
    used = usage.subtree(w.tenant)
    if used + w.gpus <= q.guaranteed:
        return None
    return (f"waits: tenant {w.tenant} at its guarantee {q.guaranteed} ({used} GPUs in use; this job needs "
            f"{w.gpus}); only preemptible jobs borrow beyond it")


def _within_type_limits(q: Quota, usage: Usage, w: Asking, allowed: frozenset[str]) -> tuple[frozenset[str], str | None]:
    caps = dict(q.type_limits)
    keep = frozenset(t for t in allowed if t not in caps or usage.by_type.get((w.tenant, t), 0) + w.gpus <= caps[t])
    if allowed and not keep:
        hit = ", ".join(f"{caps[t]} of {t}" for t in sorted(allowed) if t in caps)
        return keep, f"waits: tenant {w.tenant} at its limit {hit} GPUs (this job needs {w.gpus})"
    return keep, None


# Reclaim.
def reclaims(quotas: Mapping[str, Quota], running: Sequence[Holding], waiting: Sequence[Asking],
             free_by_node: Mapping[str, int], gang_nodes: Callable[[Asking], int] = lambda _w: 1) -> list[Reclaim]:
    """Borrowers to pause so that waiting jobs within their tenant's guarantee can start.

    `waiting` are the admitted jobs the plan could not start now, in queue order;
    `free_by_node` the GPUs free (or being freed) per node. A waiting job is served only when
    its tenant's subtree, with it, stays within the guarantee. Victims are movable jobs of
    tenants borrowing (holding beyond their guarantee), the most-borrowing tenant first,
    then the cheapest to pause, then the newest; a job whose pause would take its tenant
    below its guarantee goes only after every other. Victims are picked only if, with the
    free GPUs, they make room on one node (on `gang_nodes(job)` nodes for a gang)."""
    usage = Usage(quotas, running)
    free = dict(free_by_node)
    out: dict[str, Reclaim] = {}
    for w in waiting:
        q = quotas.get(w.tenant)
        if q is None or q.guaranteed <= 0 or usage.subtree(w.tenant) + w.gpus > q.guaranteed:
            continue
        if _room(free, [], w.gpus, gang_nodes(w)):
            continue  # it fits already: the plan will start it (or fragmentation repair will)
        picked = _victims(usage, running, out, w, free, gang_nodes(w))
        if picked is None:
            continue
        for h in picked:
            reason = (f"tenant {h.tenant} borrows {usage.borrowed(h.tenant)} GPUs beyond its guarantee "
                      f"{quotas[h.tenant].guaranteed}; tenant {w.tenant} reclaims them for {w.job_id} (within its "
                      f"guarantee {q.guaranteed})")
            out[h.job_id] = Reclaim(h.job_id, h.tenant, h.gpus, w.job_id, w.tenant, reason)
            usage.add(h.tenant, -h.gpus)
            free[h.node] = free.get(h.node, 0) + h.gpus
        usage.add(w.tenant, w.gpus)
        _take(free, w.gpus)
    return list(out.values())


def _victims(usage: Usage, running: Sequence[Holding], taken: Mapping[str, Reclaim], w: Asking,
             free: Mapping[str, int], nodes: int) -> list[Holding] | None:
    """The victims making room for `w`: for a one-node job the best node's (fewest GPUs
    paused, then the cheapest); for a gang, across nodes."""
    pool = [h for h in running if h.movable and h.job_id not in taken and h.tenant not in usage.chain(w.tenant)]
    if nodes > 1:
        return _greedy(usage, pool, w, free, nodes)
    options = [picked for node in sorted(set(free) | {h.node for h in pool})
               if (picked := _greedy(usage, [h for h in pool if h.node == node], w, {node: free.get(node, 0)}, 1))]
    return min(options, key=lambda p: (sum(h.gpus for h in p), sum(_price(h) for h in p)), default=None)


def _price(h: Holding) -> float:
    """What pausing it costs: GPU-seconds of checkpoint and restore."""
    return h.cost_s * h.gpus


def _greedy(usage: Usage, pool: list[Holding], w: Asking, free: Mapping[str, int], nodes: int) -> list[Holding] | None:
    picked: list[Holding] = []

    def excess(tenant: str) -> int:
        return usage.borrowed(tenant) - sum(p.gpus for p in picked if p.tenant == tenant)

    while not _room(free, picked, w.gpus, nodes):
        pool = [h for h in pool if excess(h.tenant) > 0]
        if not pool:
            return None
        pool.sort(key=lambda h: (h.gpus > excess(h.tenant), -excess(h.tenant), _price(h), -h.started_s, h.job_id))
        picked.append(pool.pop(0))
    return picked


def _room(free: Mapping[str, int], picked: Sequence[Holding], gpus: int, nodes: int) -> bool:
    """Whether the free GPUs plus the picked jobs' make `gpus` on at most `nodes` nodes."""
    per = dict(free)
    for h in picked:
        per[h.node] = per.get(h.node, 0) + h.gpus
    best = sorted(per.values(), reverse=True)[:nodes]
    return sum(best) >= gpus


def _take(free: dict[str, int], gpus: int) -> None:
    """The served job's GPUs leave the free pool, from the fullest node first."""
    for node in sorted(free, key=lambda n: -free[n]):
        used = min(free[node], gpus)
        free[node] -= used
        gpus -= used
        if gpus <= 0:
            return
