"""Scenario types for the allocator (docs/design.md §3) and a validator that names the bad field.

A scenario is everything a policy needs to fill one plan grid: the cluster shape, the
horizon, the objective's weights and the jobs. It is plain data so the same file drives
`rota bench allocator`, `rota sim` and the unit tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BATCH_KINDS = ("training", "batch_inference", "quantization", "trial")
REALTIME = "realtime"
KINDS = (*BATCH_KINDS, REALTIME)


class ScenarioError(ValueError):
    """A malformed scenario; `field` is a path such as `jobs[2].gpus`."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Running:
    """A batch-like job already holding GPUs when the plan is made (pinned in place)."""

    started: int  # step it started, <= 0 (0 is the first step of this horizon)
    first_gpu: int


@dataclass(frozen=True)
class BatchJob:
    id: str
    kind: str
    tenant: str
    priority: int
    gpus: int
    duration: int  # steps
    arrival: int = 0
    running: Running | None = None
    # Placement constraints: the GPU types it may run on (empty: any), and whether its whole
    # block must lie under one network switch (a gang larger than a node).
    gpu_types: frozenset[str] = frozenset()
    same_switch: bool = False

    def end(self, start: int) -> int:
        """The step after its last, if it starts at `start` (may lie past the horizon)."""
        return start + self.duration


@dataclass(frozen=True)
class RealtimeApp:
    id: str
    tenant: str
    demand: tuple[int, ...]  # GPUs wanted at each step of the horizon
    max_swap: int  # GPUs added plus removed between consecutive steps
    priority: int = 10
    kind: str = REALTIME
    # GPUs it holds now, before step 0 (a live app): the swap cap applies to step 0 too.
    held: tuple[int, ...] = ()
    gpu_types: frozenset[str] = frozenset()  # the GPU types its replicas may use; empty = any


@dataclass(frozen=True)
class Scenario:
    name: str
    gpus: int
    horizon: int
    gpus_per_node: int = 8
    step_seconds: int = 3600
    decay: float = 0.97
    realtime_penalty: float = 8.0
    batch: tuple[BatchJob, ...] = ()
    realtime: tuple[RealtimeApp, ...] = ()
    # The order jobs appeared in the file: FIFO breaks arrival ties by it.
    order: tuple[str, ...] = field(default=())
    # Per node (gpus // gpus_per_node entries, or empty for an untyped, flat cluster): the
    # GPU type of its GPUs and the switch it hangs off ("" = untyped / unknown).
    node_types: tuple[str, ...] = ()
    node_switches: tuple[str, ...] = ()

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    def job(self, job_id: str) -> BatchJob | RealtimeApp:
        for j in self.batch:
            if j.id == job_id:
                return j
        for r in self.realtime:
            if r.id == job_id:
                return r
        raise KeyError(job_id)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _int(d: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    if key not in d:
        if default is None:
            raise ScenarioError(f"{where}{key}", "is required")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ScenarioError(f"{where}{key}", f"must be an integer, got {v!r}")
    return v


def _num(d: Mapping[str, Any], key: str, default: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ScenarioError(key, f"must be a number, got {v!r}")
    return float(v)


def _batch(d: Mapping[str, Any], where: str, kind: str, gpus: int) -> BatchJob:
    n = _int(d, "gpus", where)
    if not is_power_of_two(n):
        raise ScenarioError(f"{where}gpus", f"must be a power of two, got {n}")
    if n > gpus:
        raise ScenarioError(f"{where}gpus", f"{n} exceeds the cluster's {gpus} GPUs")
    duration = _int(d, "duration", where)
    if duration < 1:
        raise ScenarioError(f"{where}duration", f"must be at least 1 step, got {duration}")
    arrival = _int(d, "arrival", where, 0)
    if arrival < 0:
        raise ScenarioError(f"{where}arrival", f"must not be negative, got {arrival}")
    running = None
    if d.get("running") is not None:
        r = d["running"]
        if not isinstance(r, Mapping):
            raise ScenarioError(f"{where}running", "must be an object {started, first_gpu}")
        started = _int(r, "started", f"{where}running.")
        first = _int(r, "first_gpu", f"{where}running.")
        if started > 0:
            raise ScenarioError(f"{where}running.started", f"a running job started at or before 0, got {started}")
        if started + duration <= 0:
            raise ScenarioError(f"{where}running.started", "the job would already have finished")
        if first < 0 or first + n > gpus:
            raise ScenarioError(f"{where}running.first_gpu", f"block {first}..{first + n - 1} is outside the cluster")
        if first % n:
            raise ScenarioError(f"{where}running.first_gpu", f"{first} is not aligned to the job's {n} GPUs")
        running = Running(started, first)
    return BatchJob(
        id=str(d["id"]), kind=kind, tenant=str(d.get("tenant", "default")),
        priority=_priority(d, where), gpus=n, duration=duration, arrival=arrival, running=running,
        gpu_types=_types(d, where), same_switch=_flag(d, "same_switch", where),
    )


def _types(d: Mapping[str, Any], where: str) -> frozenset[str]:
    v = d.get("gpu_types", [])
    if not isinstance(v, list) or not all(isinstance(t, str) and t for t in v):
        raise ScenarioError(f"{where}gpu_types", "must be a list of GPU type names")
    return frozenset(v)


def _flag(d: Mapping[str, Any], key: str, where: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise ScenarioError(f"{where}{key}", f"must be true or false, got {v!r}")
    return v


def _labels(d: Mapping[str, Any], key: str, nodes: int) -> tuple[str, ...]:
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(t, str) for t in v):
        raise ScenarioError(key, "must be a list of strings, one per node")
    if v and len(v) != nodes:
        raise ScenarioError(key, f"has {len(v)} entries, the cluster has {nodes} nodes")
    return tuple(v)


def _priority(d: Mapping[str, Any], where: str, default: int = 5) -> int:
    p = _int(d, "priority", where, default)
    if not 1 <= p <= 10:
        raise ScenarioError(f"{where}priority", f"must be 1..10, got {p}")
    return p


def _realtime(d: Mapping[str, Any], where: str, gpus: int, horizon: int) -> RealtimeApp:
    demand = d.get("demand")
    if not isinstance(demand, list):
        raise ScenarioError(f"{where}demand", "a realtime app needs a demand curve (a list)")
    if len(demand) != horizon:
        raise ScenarioError(f"{where}demand", f"has {len(demand)} steps, the horizon is {horizon}")
    for i, v in enumerate(demand):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= gpus:
            raise ScenarioError(f"{where}demand[{i}]", f"must be an integer in 0..{gpus}, got {v!r}")
    swap = _int(d, "max_swap", where)
    if swap < 0:
        raise ScenarioError(f"{where}max_swap", f"must not be negative, got {swap}")
    held = d.get("held", [])
    if not isinstance(held, list) or len(set(held)) != len(held):
        raise ScenarioError(f"{where}held", "must be a list of distinct GPU indices")
    for i, g in enumerate(held):
        if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < gpus:
            raise ScenarioError(f"{where}held[{i}]", f"must be a GPU index in 0..{gpus - 1}, got {g!r}")
    return RealtimeApp(
        id=str(d["id"]), tenant=str(d.get("tenant", "default")), demand=tuple(demand),
        max_swap=swap, priority=_priority(d, where, 10), held=tuple(held),
    )


def from_dict(d: Mapping[str, Any]) -> Scenario:
    """Build and validate a scenario; raises ScenarioError naming the first bad field."""
    if not isinstance(d, Mapping):
        raise ScenarioError("scenario", "must be a JSON object")
    gpus = _int(d, "gpus", "")
    if not is_power_of_two(gpus):
        raise ScenarioError("gpus", f"must be a power of two, got {gpus}")
    per_node = _int(d, "gpus_per_node", "", min(8, gpus))
    if not is_power_of_two(per_node) or per_node > gpus:
        raise ScenarioError("gpus_per_node", f"must be a power of two no larger than gpus, got {per_node}")
    horizon = _int(d, "horizon", "")
    if horizon < 1:
        raise ScenarioError("horizon", f"must be at least 1, got {horizon}")
    step = _int(d, "step_seconds", "", 3600)
    if step < 1:
        raise ScenarioError("step_seconds", f"must be positive, got {step}")
    decay = _num(d, "decay", 0.97)
    if not 0 < decay <= 1:
        raise ScenarioError("decay", f"must be in (0, 1], got {decay}")
    penalty = _num(d, "realtime_penalty", 8.0)
    if penalty < 0:
        raise ScenarioError("realtime_penalty", f"must not be negative, got {penalty}")
    jobs = d.get("jobs", [])
    if not isinstance(jobs, list):
        raise ScenarioError("jobs", "must be a list")
    batch: list[BatchJob] = []
    realtime: list[RealtimeApp] = []
    seen: set[str] = set()
    owner: dict[int, str] = {}
    for i, j in enumerate(jobs):
        where = f"jobs[{i}]."
        if not isinstance(j, Mapping):
            raise ScenarioError(f"jobs[{i}]", "must be an object")
        if not isinstance(j.get("id"), str) or not j["id"]:
            raise ScenarioError(f"{where}id", "must be a non-empty string")
        if j["id"] in seen:
            raise ScenarioError(f"{where}id", f"duplicate id {j['id']!r}")
        seen.add(j["id"])
        kind = j.get("kind")
        if kind not in KINDS:
            raise ScenarioError(f"{where}kind", f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        if kind == REALTIME:
            realtime.append(_realtime(j, where, gpus, horizon))
        else:
            batch.append(_batch(j, where, str(kind), gpus))
            _check_running_overlap(batch[-1], where, owner)
    node_types = _labels(d, "node_types", gpus // per_node)
    node_switches = _labels(d, "node_switches", gpus // per_node)
    for b in batch:
        if node_types and b.gpu_types and not b.gpu_types & set(node_types):
            where = f"jobs[{[j.get('id') for j in jobs].index(b.id)}]."
            raise ScenarioError(f"{where}gpu_types", f"no node has GPUs of type {', '.join(sorted(b.gpu_types))}")
    return Scenario(
        name=str(d.get("name", "unnamed")), gpus=gpus, horizon=horizon, gpus_per_node=per_node,
        step_seconds=step, decay=decay, realtime_penalty=penalty, batch=tuple(batch),
        realtime=tuple(realtime), order=tuple(str(j["id"]) for j in jobs),
        node_types=node_types, node_switches=node_switches,
    )


def _check_running_overlap(j: BatchJob, where: str, owner: dict[int, str]) -> None:
    # Running jobs all hold their blocks at step 0, so any shared GPU is a double booking.
    if j.running is None:
        return
    for g in range(j.running.first_gpu, j.running.first_gpu + j.gpus):
        if g in owner:
            raise ScenarioError(f"{where}running.first_gpu", f"GPU {g} is already held by running job {owner[g]}")
        owner[g] = j.id


def to_dict(s: Scenario) -> dict[str, Any]:
    jobs: dict[str, dict[str, Any]] = {}
    for b in s.batch:
        jd: dict[str, Any] = {"id": b.id, "kind": b.kind, "tenant": b.tenant, "priority": b.priority,
                              "gpus": b.gpus, "duration": b.duration, "arrival": b.arrival}
        if b.running:
            jd["running"] = {"started": b.running.started, "first_gpu": b.running.first_gpu}
        if b.gpu_types:
            jd["gpu_types"] = sorted(b.gpu_types)
        if b.same_switch:
            jd["same_switch"] = True
        jobs[b.id] = jd
    for r in s.realtime:
        jobs[r.id] = {"id": r.id, "kind": REALTIME, "tenant": r.tenant, "priority": r.priority,
                      "demand": list(r.demand), "max_swap": r.max_swap}
        if r.held:
            jobs[r.id]["held"] = list(r.held)
    order = list(s.order) or list(jobs)
    out = {"name": s.name, "gpus": s.gpus, "gpus_per_node": s.gpus_per_node, "horizon": s.horizon,
           "step_seconds": s.step_seconds, "decay": s.decay, "realtime_penalty": s.realtime_penalty,
           "jobs": [jobs[i] for i in order]}
    if s.node_types:
        out["node_types"] = list(s.node_types)
    if s.node_switches:
        out["node_switches"] = list(s.node_switches)
    return out


def load(path: str | Path) -> Scenario:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ScenarioError(str(path), f"is not valid JSON ({e.msg} at line {e.lineno})") from e
    return from_dict(data)
