"""A job's specification as plain data, and its validation (pure).

The api validates every submission here before anything is stored; the error names the
field and the reason. Limits keep one job from bloating the database or the plan.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from rota.core import dependencies, quantities
from rota.core.errors import InvalidArgument

KINDS = ("training", "batch_inference", "quantization", "realtime", "trial")
BATCH_LIKE = frozenset({"training", "batch_inference", "quantization", "trial"})
RESTART_POLICIES = ("never", "on-failure")
DEFAULT_MAX_RETRIES = 3

MAX_NAME = 128
MAX_ARGS = 256
MAX_ARG_BYTES = 4096
MAX_ENV = 64
MAX_FEATURES = 64
MAX_DEMAND_STEPS = 24 * 7 * 4
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ENV_KEY_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GPU_TYPE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
MAX_GANG_NODES = 1024
MAX_TIME_LIMIT_S = 365 * 86400.0
MAX_GPU_MEMORY_MB = 1 << 24  # 16 TiB: past any GPU's memory, so a larger figure is a typo


@dataclass
class JobSpecData:
    name: str = ""
    tenant: str = ""
    kind: str = ""
    priority: int = 0
    gpus: int = 0
    command: list[str] = field(default_factory=list)
    workdir: str = ""
    env: dict[str, str] = field(default_factory=dict)
    duration_seconds: float | None = None
    preemptible: bool = False
    restart: str = "never"
    max_retries: int = 0
    features: dict[str, Any] = field(default_factory=dict)
    demand: list[int] = field(default_factory=list)
    max_swap: int = 0
    # The failure detector may restart the job with a re-planned 3-D layout (ROTA_LAYOUT).
    accepts_layout_changes: bool = False
    # A gang: whole nodes x GPUs on each (0: one node, or as many whole nodes as gpus fills).
    nodes: int = 0
    gpus_per_node: int = 0
    gpu_types: list[str] = field(default_factory=list)  # empty: any type
    same_switch: bool = False
    # Parents and conditions ({"job": id, "when": succeeded|finished|failed}): the job waits
    # until each holds (rota.core.dependencies); the api checks that every parent exists.
    depends_on: list[dict[str, str]] = field(default_factory=list)
    # The GPU memory it needs on each GPU, in MiB (0: not said). A trial is placed in a
    # pipeline's bubbles only beside a stage that reports that much free.
    gpu_memory_mb: int = 0
    # Limits the node's agent enforces (a cgroup per launch, rota.agent.cgroups) and the plan
    # reserves: CPUs (a quota), memory per node as written (a quantity such as "4Gi"; "": none)
    # and a wall-clock limit per run (None: none).
    cpus: float | None = None
    memory: str = ""
    time_limit_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> JobSpecData:
        return JobSpecData(**data)

    def canonical_json(self) -> str:
        """The spec as JSON with sorted keys: what a job row stores, and what `digest` hashes.
        Every field is a JSON value already, so the fields serialize as they are, without
        the deep copy `to_dict` makes (this runs for every submission)."""
        return json.dumps(vars(self), sort_keys=True)

    def digest(self) -> str:
        """Identity of the submission body, for idempotent retries."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def gpus_to_hold(spec: JobSpecData) -> int:
    """GPUs the live cluster reserves: batch-like jobs their block; realtime its peak (FIFO)."""
    if spec.kind == "realtime" and spec.demand:
        return next_power_of_two(max(max(spec.demand), spec.gpus, 1))
    return spec.gpus


def _require(condition: bool, field_name: str, reason: str) -> None:
    if not condition:
        raise InvalidArgument(field_name, reason)


def validate(
    spec: JobSpecData, *, max_gpus_per_node: int, known_gpu_types: frozenset[str] | None = None,
) -> JobSpecData:
    """Returns the normalised spec or raises InvalidArgument naming the first bad field.

    `max_gpus_per_node` is the largest registered node (0: none yet) and `known_gpu_types`
    the types registered nodes advertise (None: not known, nothing is checked).
    """
    _require(len(spec.command) > 0, "command", "must not be empty")
    _require(len(spec.command) <= MAX_ARGS, "command", f"more than {MAX_ARGS} arguments")
    for i, arg in enumerate(spec.command):
        _require(len(arg.encode()) <= MAX_ARG_BYTES, f"command[{i}]", f"longer than {MAX_ARG_BYTES} bytes")
    _require(spec.command[0] != "", "command[0]", "must not be empty")
    if not spec.name and spec.command:
        spec.name = _default_name(spec.command)
    _require(bool(spec.name), "name", "must not be empty")
    _require(len(spec.name) <= MAX_NAME, "name", f"longer than {MAX_NAME} characters")
    _require(bool(NAME_PATTERN.match(spec.name)), "name", "use letters, digits, '.', '_' or '-'")
    _require(bool(spec.tenant), "tenant", "must not be empty")
    _require(spec.kind in KINDS, "kind", f"unknown kind {spec.kind!r}; one of {', '.join(KINDS)}")
    _require(1 <= spec.priority <= 10, "priority", f"must be between 1 and 10 (got {spec.priority})")
    _validate_gang(spec, max_gpus_per_node)
    _validate_gpus(spec, max_gpus_per_node)
    _validate_types(spec, known_gpu_types)
    _require(len(spec.workdir.encode()) <= MAX_ARG_BYTES, "workdir", f"longer than {MAX_ARG_BYTES} bytes")
    _require(len(spec.env) <= MAX_ENV, "env", f"more than {MAX_ENV} variables")
    for key, value in spec.env.items():
        _require(bool(ENV_KEY_PATTERN.match(key)), f"env.{key}", "not a valid variable name")
        _require(not key.startswith("ROTA_"), f"env.{key}", "ROTA_ variables are set by the agent")
        _require(len(value.encode()) <= MAX_ARG_BYTES, f"env.{key}", f"longer than {MAX_ARG_BYTES} bytes")
    if spec.duration_seconds is not None:
        d = spec.duration_seconds
        _require(math.isfinite(d) and d > 0, "duration", f"must be positive (got {d:g} seconds)")
    _require(spec.restart in RESTART_POLICIES, "restart", f"one of {', '.join(RESTART_POLICIES)}")
    _require(0 <= spec.max_retries <= 100, "max_retries", "must be between 0 and 100")
    if spec.restart == "on-failure" and spec.max_retries == 0:
        spec.max_retries = DEFAULT_MAX_RETRIES
    _require(len(spec.features) <= MAX_FEATURES, "features", f"more than {MAX_FEATURES} entries")
    _require(len(json.dumps(spec.features)) <= 16 * 1024, "features", "larger than 16 KiB")
    _require(0 <= spec.gpu_memory_mb <= MAX_GPU_MEMORY_MB, "gpu_memory_mb",
             f"MiB per GPU, from 0 (not said) to {MAX_GPU_MEMORY_MB} (got {spec.gpu_memory_mb})")
    _validate_limits(spec)
    spec.depends_on = dependencies.validate(spec.depends_on)
    return spec


def _validate_limits(spec: JobSpecData) -> None:
    """`cpus`, `memory` and `time_limit`: each absent, or positive and readable."""
    if spec.cpus is not None:
        c = spec.cpus
        _require(math.isfinite(c) and c > 0, "cpus", f"must be positive (got {c:g})")
        _require(c <= quantities.MAX_CPUS, "cpus", f"more than {quantities.MAX_CPUS:g} CPUs (got {c:g})")
    if spec.memory:
        problem = quantities.memory_problem(spec.memory)
        _require(problem is None, "memory", problem or "")
    if spec.time_limit_seconds is not None:
        t = spec.time_limit_seconds
        _require(math.isfinite(t) and t >= 1, "time_limit", f"must be at least one second (got {t:g} seconds)")
        _require(t <= MAX_TIME_LIMIT_S, "time_limit", f"more than 365 days (got {t:g} seconds)")


def memory_bytes(spec: JobSpecData) -> int:
    """The job's memory limit per node in bytes (0: none); the spec was validated."""
    return quantities.parse_memory(spec.memory) if spec.memory else 0


def _default_name(command: list[str]) -> str:
    """The script's name (`python examples/train_lm.py ...` -> `train_lm`), else the program's."""
    script = next((a for a in command if a.endswith((".py", ".sh"))), command[0])
    stem = script.rsplit("/", 1)[-1].rsplit(".", 1)[0] if "." in script else script.rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-")[:MAX_NAME]
    return name or "job"


def _validate_gpus(spec: JobSpecData, max_gpus_per_node: int) -> None:
    if spec.kind == "realtime":
        _require(len(spec.demand) <= MAX_DEMAND_STEPS, "demand", f"more than {MAX_DEMAND_STEPS} steps")
        _require(all(d >= 0 for d in spec.demand), "demand", "GPU counts must not be negative")
        _require(spec.max_swap >= 0, "max_swap", "must not be negative")
        _require(spec.gpus > 0 or any(spec.demand), "gpus", "a realtime app needs gpus or a demand curve")
        if spec.gpus:
            _require(is_power_of_two(spec.gpus), "gpus", f"must be a power of two (got {spec.gpus})")
    else:
        _require(not spec.demand, "demand", "only realtime apps have a demand curve")
        _require(is_power_of_two(spec.gpus), "gpus", f"must be a power of two (got {spec.gpus})")
    # A batch-like job larger than a node is a gang of whole nodes (see _validate_gang); a
    # gang larger than today's cluster waits for nodes to join (`rota explain` says so). A
    # realtime app's replicas (one GPU each) go on any nodes, so its demand has no node cap.


def _validate_gang(spec: JobSpecData, largest_node: int) -> None:
    """`nodes` x `gpus_per_node`, or `gpus` above the largest node: whole aligned node blocks."""
    _require(0 <= spec.nodes <= MAX_GANG_NODES, "nodes", f"must be between 0 and {MAX_GANG_NODES} (got {spec.nodes})")
    _require(spec.gpus_per_node >= 0, "gpus_per_node", f"must not be negative (got {spec.gpus_per_node})")
    if spec.nodes == 0 and spec.gpus_per_node == 0:
        return
    _require(spec.kind != "realtime", "nodes", "a realtime app scales by replicas, not by nodes")
    _require(spec.nodes > 0, "nodes", "required with gpus_per_node")
    _require(is_power_of_two(spec.nodes), "nodes", f"must be a power of two (got {spec.nodes}): "
             "a gang takes an aligned block of whole nodes")
    if spec.gpus_per_node == 0:  # whole nodes: as many GPUs as `gpus` spreads over them
        _require(spec.gpus > 0 and spec.gpus % spec.nodes == 0, "gpus",
                 f"with nodes: {spec.nodes} and no gpus_per_node, gpus must be a multiple of {spec.nodes}")
        spec.gpus_per_node = spec.gpus // spec.nodes
    _require(is_power_of_two(spec.gpus_per_node), "gpus_per_node", f"must be a power of two (got {spec.gpus_per_node})")
    _require(largest_node == 0 or spec.gpus_per_node <= largest_node, "gpus_per_node",
             f"{spec.gpus_per_node} GPUs exceed the largest node in the cluster ({largest_node} GPUs)")
    total = spec.nodes * spec.gpus_per_node
    _require(spec.gpus in (0, total), "gpus", f"must equal nodes x gpus_per_node = {total} (got {spec.gpus})")
    spec.gpus = total


def _validate_types(spec: JobSpecData, known: frozenset[str] | None) -> None:
    _require(len(spec.gpu_types) <= 16, "gpu_types", "more than 16 types")
    for i, t in enumerate(spec.gpu_types):
        _require(bool(GPU_TYPE_PATTERN.match(t)), f"gpu_types[{i}]", f"{t!r} is not a GPU type name (e.g. a100, h100)")
    spec.gpu_types = sorted(set(spec.gpu_types))
    if known is not None and spec.gpu_types and known:
        _require(bool(set(spec.gpu_types) & known), "gpu_types",
                 f"no node has GPUs of type {', '.join(spec.gpu_types)} (the cluster has {', '.join(sorted(known))})")
    _require(not spec.same_switch or spec.kind != "realtime", "same_switch", "only for gangs of batch-like jobs")
