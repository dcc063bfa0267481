"""Scenario types for the allocator (docs/design.md §3) and a validator that names the bad field.

A scenario is everything a policy needs to fill one plan grid: the cluster shape, the
horizon, the objective's weights and the jobs. It is plain data so the same file drives
`rota bench allocator`, `rota sim` and the unit tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rota.core.schema import Field, Schema, SchemaError, validate

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


_INTEGER = "must be an integer, got {value}"


def _int(**options: Any) -> Field:
    return Field(kind=int, **{"type_reason": _INTEGER, **options})


def _number(**options: Any) -> Field:
    return Field(kind=(int, float), type_reason="must be a number, got {value}", convert=_as_float, **options)


def _as_float(v: Any) -> Any:
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def _power_of_two(n: int) -> str | None:
    return None if is_power_of_two(n) else f"must be a power of two, got {n}"


def _strings(reason: str, *, non_empty: bool = False) -> Field:
    return Field(kind=list, type_reason=reason, default=[],
                 checks=(lambda v: None if all(isinstance(t, str) and (t or not non_empty) for t in v) else reason,))


def _cluster_shape(d: dict[str, Any]) -> list[tuple[str, str]]:
    gpus, per_node = d["gpus"], d.setdefault("gpus_per_node", min(8, d["gpus"]))  # a default from gpus
    if not is_power_of_two(per_node) or per_node > gpus:
        return [("gpus_per_node", f"must be a power of two no larger than gpus, got {per_node}")]
    nodes = gpus // per_node
    return [(key, f"has {len(d[key])} entries, the cluster has {nodes} nodes")
            for key in ("node_types", "node_switches") if d[key] and len(d[key]) != nodes]


SCENARIO = Schema({
    "name": Field(default="unnamed", convert=str),
    "gpus": _int(required=True, checks=(_power_of_two,)),
    "gpus_per_node": _int(),
    "horizon": _int(required=True, low=1, range_reason="must be at least 1, got {value}"),
    "step_seconds": _int(default=3600, low=1, range_reason="must be positive, got {value}"),
    "decay": _number(default=0.97, checks=(lambda v: None if 0 < v <= 1 else f"must be in (0, 1], got {v}",)),
    "realtime_penalty": _number(default=8.0, low=0, range_reason="must not be negative, got {value}"),
    "jobs": Field(kind=list, type_reason="must be a list", default=[]),
    "node_types": _strings("must be a list of strings, one per node"),
    "node_switches": _strings("must be a list of strings, one per node"),
}, checks=(_cluster_shape,))


def _job_schema(gpus: int, horizon: int) -> Callable[[Mapping[str, Any]], Schema]:
    """A job's fields in a cluster of `gpus` GPUs and `horizon` steps: by its kind."""
    common = {
        "id": Field(kind=str, required=True, missing_reason="must be a non-empty string",
                    type_reason="must be a non-empty string",
                    checks=(lambda v: None if v else "must be a non-empty string",)),
        "kind": Field(choices=KINDS, required=True, missing_reason=f"unknown kind None; one of {', '.join(KINDS)}",
                      choices_reason="unknown kind {value}; one of {choices}"),
        "tenant": Field(default="default", convert=str),
    }
    priority = {"low": 1, "high": 10, "range_reason": "must be 1..10, got {value}"}

    def running_fits(d: dict[str, Any]) -> list[tuple[str, str]]:
        r, n = d.get("running"), d["gpus"]
        if r is None:
            return []
        if r["started"] + d["duration"] <= 0:
            return [("running.started", "the job would already have finished")]
        first = r["first_gpu"]
        if first < 0 or first + n > gpus:
            return [("running.first_gpu", f"block {first}..{first + n - 1} is outside the cluster")]
        return [("running.first_gpu", f"{first} is not aligned to the job's {n} GPUs")] if first % n else []

    running = Schema({
        "started": _int(required=True, high=0, range_reason="a running job started at or before 0, got {value}"),
        "first_gpu": _int(required=True),
    })
    batch = Schema({
        **common, "priority": _int(default=5, **priority),
        "gpus": _int(required=True, checks=(_power_of_two, lambda n: None if n <= gpus else
                                            f"{n} exceeds the cluster's {gpus} GPUs")),
        "duration": _int(required=True, low=1, range_reason="must be at least 1 step, got {value}"),
        "arrival": _int(default=0, low=0, range_reason="must not be negative, got {value}"),
        "running": Field(nullable=True, kind=Mapping, type_reason="must be an object {{started, first_gpu}}",
                         schema=running),
        "gpu_types": _strings("must be a list of GPU type names", non_empty=True),
        "same_switch": Field(kind=bool, default=False, type_reason="must be true or false, got {value}"),
    }, checks=(running_fits,))
    realtime = Schema({
        **common, "priority": _int(default=10, **priority),
        "demand": Field(kind=list, required=True, missing_reason="a realtime app needs a demand curve (a list)",
                        type_reason="a realtime app needs a demand curve (a list)",
                        items=_int(low=0, high=gpus, type_reason=f"must be an integer in 0..{gpus}, got {{value}}",
                                   range_reason=f"must be an integer in 0..{gpus}, got {{value}}"),
                        checks=(lambda v: None if len(v) == horizon else
                                f"has {len(v)} steps, the horizon is {horizon}",)),
        "max_swap": _int(required=True, low=0, range_reason="must not be negative, got {value}"),
        "held": Field(kind=list, default=[], type_reason="must be a list of distinct GPU indices",
                      items=_int(low=0, high=gpus - 1, type_reason=f"must be a GPU index in 0..{gpus - 1}, got {{value}}",
                                 range_reason=f"must be a GPU index in 0..{gpus - 1}, got {{value}}"),
                      checks=(lambda v: None if len(set(v)) == len(v) else "must be a list of distinct GPU indices",)),
        "gpu_types": _strings("must be a list of GPU type names", non_empty=True),
    })
    return lambda job: realtime if job.get("kind") == REALTIME else batch


def from_dict(d: Mapping[str, Any]) -> Scenario:
    """Build and validate a scenario; raises ScenarioError naming the first bad field."""
    if not isinstance(d, Mapping):
        raise ScenarioError("scenario", "must be a JSON object")
    try:
        top = validate(SCENARIO, d)
        gpus = top["gpus"]
        jobs = validate(Schema({"jobs": Field(items=Field(kind=Mapping, type_reason="must be an object",
                                                          schema=_job_schema(gpus, top["horizon"])))}),
                        {"jobs": top["jobs"]})["jobs"]
    except SchemaError as exc:
        raise ScenarioError(exc.field, exc.reason) from None
    _check_ids_and_blocks(jobs)
    batch = [_batch(j) for j in jobs if j["kind"] != REALTIME]
    for i, j in enumerate(jobs):
        if top["node_types"] and j.get("gpu_types") and not set(j["gpu_types"]) & set(top["node_types"]):
            raise ScenarioError(f"jobs[{i}].gpu_types", f"no node has GPUs of type {', '.join(sorted(j['gpu_types']))}")
    return Scenario(
        name=top["name"], gpus=gpus, horizon=top["horizon"], gpus_per_node=top["gpus_per_node"],
        step_seconds=top["step_seconds"], decay=top["decay"], realtime_penalty=top["realtime_penalty"],
        batch=tuple(batch), realtime=tuple(_realtime(j) for j in jobs if j["kind"] == REALTIME),
        order=tuple(j["id"] for j in jobs), node_types=tuple(top["node_types"]),
        node_switches=tuple(top["node_switches"]),
    )


def _check_ids_and_blocks(jobs: list[dict[str, Any]]) -> None:
    """Ids are unique; running jobs all hold their blocks at step 0, so a shared GPU is a
    double booking."""
    seen: set[str] = set()
    owner: dict[int, str] = {}
    for i, j in enumerate(jobs):
        if j["id"] in seen:
            raise ScenarioError(f"jobs[{i}].id", f"duplicate id {j['id']!r}")
        seen.add(j["id"])
        running = j.get("running")
        if running is None:
            continue
        for g in range(running["first_gpu"], running["first_gpu"] + j["gpus"]):
            if g in owner:
                raise ScenarioError(f"jobs[{i}].running.first_gpu", f"GPU {g} is already held by running job {owner[g]}")
            owner[g] = j["id"]


def _batch(j: dict[str, Any]) -> BatchJob:
    r = j.get("running")
    return BatchJob(
        id=j["id"], kind=j["kind"], tenant=j["tenant"], priority=j["priority"], gpus=j["gpus"],
        duration=j["duration"], arrival=j["arrival"], running=Running(r["started"], r["first_gpu"]) if r else None,
        gpu_types=frozenset(j["gpu_types"]), same_switch=j["same_switch"],
    )


def _realtime(j: dict[str, Any]) -> RealtimeApp:
    return RealtimeApp(id=j["id"], tenant=j["tenant"], demand=tuple(j["demand"]), max_swap=j["max_swap"],
                       priority=j["priority"], held=tuple(j["held"]), gpu_types=frozenset(j["gpu_types"]))


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
        if r.gpu_types:
            jobs[r.id]["gpu_types"] = sorted(r.gpu_types)
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
