"""sbatch's options -> a Rota job file (a mapping `rota.client.spec_from_mapping` reads) and
the in-job launcher's command line (rota.slurm.batch)."""

from __future__ import annotations

import dataclasses
import re
import signal
from pathlib import Path
from typing import Any

from rota.client.jobspec import JobSpec
from rota.slurm import ids
from rota.slurm.directives import DirectiveError, Options

CHUNK = 4000  # bytes of script per command argument (a job file's argument holds at most 4096)
MAX_REQUEUES = 5  # Rota's max_retries for an sbatch job: how often `scontrol requeue` may bring it back
DEFAULT_SIGNAL_LEAD_S = 60  # Slurm's default lead time when `--signal=SIG` names no @seconds
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_DEPENDENCY_KINDS = {"afterok": "succeeded", "afterany": "finished", "afternotok": "failed"}


def limits_supported() -> bool:
    """Whether this build's job files carry `cpus`, `memory` and `time_limit` (the job limits)."""
    names = {f.name for f in dataclasses.fields(JobSpec)}
    return {"cpus", "memory", "time_limit"} <= names


def seconds_of_time(text: str) -> int | None:
    """Slurm's --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; UNLIMITED/INFINITE -> None."""
    value = text.strip()
    if value.upper() in {"UNLIMITED", "INFINITE"}:
        return None
    days = 0
    if "-" in value:
        day_text, value = value.split("-", 1)
        days = _number(day_text, "--time", text)
        parts = [_number(p, "--time", text) for p in value.split(":")]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        parts = [_number(p, "--time", text) for p in value.split(":")]
        if len(parts) > 3:
            raise DirectiveError(f"--time: {text!r} is not a Slurm time (M, M:S, H:M:S, D-H[:M[:S]])")
        hours, minutes, seconds = [0, *parts, 0][:3] if len(parts) < 3 else parts
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise DirectiveError(f"--time: must be positive (got {text!r})")
    return total


def memory_of(text: str) -> str:
    """Slurm's --mem (megabytes by default; K, M, G, T suffixes) -> the job file's `memory` ("4Gi")."""
    found = re.fullmatch(r"(\d+)([KMGT]?)B?", text.strip().upper())
    if found is None or int(found.group(1)) == 0:
        raise DirectiveError(f"--mem: {text!r} is not a positive size such as 4G or 4096M")
    unit = found.group(2) or "M"
    return f"{found.group(1)}{unit}i"


def signal_of(text: str) -> tuple[str, int, bool]:
    """--signal=[B:]SIG[@SECONDS] -> (signal name without SIG, lead seconds, to the batch shell only)."""
    batch = text.startswith("B:")
    body = text[2:] if batch else text
    name, _, lead = body.partition("@")
    name = name.upper().removeprefix("SIG")
    if not name.isdigit() and not hasattr(signal, "SIG" + name):
        raise DirectiveError(f"--signal: unknown signal {name!r}")
    return name, _number(lead, "--signal", text) if lead else DEFAULT_SIGNAL_LEAD_S, batch


def _number(text: str, option: str, whole: str) -> int:
    if not text.strip().isdigit():
        raise DirectiveError(f"{option}: {whole!r} is not understood (expected whole numbers)")
    return int(text)


def gpus_of(options: Options) -> tuple[int, str]:
    """GPUs per node and the GPU type named in --gres=gpu[:TYPE]:N, --gpus or --gpus-per-node."""
    gpus, gpu_type = 0, ""
    if options.has("gres"):
        for item in options.get("gres").split(","):
            parts = item.split(":")
            if parts[0] != "gpu" or len(parts) > 3:
                raise DirectiveError(f"--gres: {item!r}: only gpu[:TYPE][:N] is supported")
            gpus = _number(parts[-1], "--gres", item) if len(parts) > 1 and parts[-1].isdigit() else 1
            gpu_type = parts[1] if len(parts) == 3 or (len(parts) == 2 and not parts[1].isdigit()) else ""
    for option in ("gpus", "gpus-per-node"):
        if options.has(option):
            text = options.get(option)
            kind, _, count = text.rpartition(":")
            gpus, gpu_type = _number(count, f"--{option}", text), kind or gpu_type
    return gpus, gpu_type


def dependencies_of(text: str) -> list[dict[str, str]]:
    """--dependency=afterok:1:2,afterany:3 -> depends_on entries; `?` (any of) is refused."""
    if "?" in text:
        raise DirectiveError("--dependency: '?' (any one of) is not supported; use ',' (all of)")
    entries: list[dict[str, str]] = []
    for item in text.split(","):
        kind, *jobs = item.split(":")
        if kind not in _DEPENDENCY_KINDS or not jobs:
            raise DirectiveError(f"--dependency: {item!r}: supported are afterok, afterany and afternotok with job ids")
        for job in jobs:
            try:
                entries.append({"job": ids.rota_id(job), "when": _DEPENDENCY_KINDS[kind]})
            except ids.SlurmIdError as exc:
                raise DirectiveError(f"--dependency: {exc}") from exc
    return entries


def tasks_per_node(options: Options, nodes: int) -> int:
    per_node = _number(options.get("ntasks-per-node", "1"), "--ntasks-per-node", options.get("ntasks-per-node"))
    if options.has("ntasks"):
        total = _number(options.get("ntasks"), "--ntasks", options.get("ntasks"))
        if total % nodes:
            raise DirectiveError(f"--ntasks: {total} tasks do not divide evenly over {nodes} nodes")
        per_node = total // nodes
    if per_node < 1:
        raise DirectiveError("--ntasks-per-node: must be at least 1")
    return per_node


def job_name(options: Options, script: str) -> str:
    raw = options.get("job-name") or Path(script).name or "sbatch"
    return (_NAME_CHARS.sub("_", raw).lstrip("._-") or "sbatch")[:128]


def launcher_command(options: Options, text: str, spool: Path, script: str, tasks: int) -> list[str]:
    """`python -m rota.slurm.batch FLAGS -- CHUNKS...`: the script travels in the job file itself
    (as Slurm keeps a copy), cut into arguments a job file holds."""
    command = ["python", "-m", "rota.slurm.batch", "--spool", str(spool), "--script-name", Path(script).name,
               "--ntasks-per-node", str(tasks), "--submit-dir", str(Path.cwd())]
    for option in ("output", "error", "open-mode", "signal", "time", "job-name", "account", "partition",
                   "cpus-per-task"):
        if options.has(option):
            command += [f"--{option}", options.get(option)]
    chunks = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    return [*command, "--", *chunks]


def job_file(options: Options, text: str, script: str, spool: Path) -> dict[str, Any]:
    """The Rota job file for this sbatch submission. DirectiveError for what cannot be honoured."""
    nodes = _number(options.get("nodes", "1"), "--nodes", options.get("nodes"))
    if nodes < 1:
        raise DirectiveError("--nodes: must be at least 1")
    gpus, gpu_type = gpus_of(options)
    tasks = tasks_per_node(options, nodes)
    mapping: dict[str, Any] = {
        "name": job_name(options, script),
        "gpus": max(gpus, 1),  # a Rota job holds at least one GPU slot
        "command": launcher_command(options, text, spool, script, tasks),
        "workdir": str(Path(options.get("chdir") or ".").resolve()),
        "restart": "never" if options.has("no-requeue") else "on-failure",
        "max_retries": 0 if options.has("no-requeue") else MAX_REQUEUES,
    }
    if nodes > 1:  # a gang of whole nodes: `gpus` is nodes x gpus_per_node
        del mapping["gpus"]
        mapping.update(nodes=nodes, gpus_per_node=max(gpus, 1))
    _placement(options, gpu_type, mapping)
    if options.has("account"):
        mapping["tenant"] = options.get("account")
    if options.has("time"):
        seconds = seconds_of_time(options.get("time"))
        if seconds is not None:
            mapping["duration"] = seconds
    _limits(options, mapping, tasks)
    if options.has("array"):
        mapping["array"] = options.get("array")
    if options.has("dependency"):
        mapping["depends_on"] = dependencies_of(options.get("dependency"))
    _check_launcher_options(options)
    mapping["env"] = exports_of(options.get("export", "NONE"))
    return mapping


def _placement(options: Options, gpu_type: str, mapping: dict[str, Any]) -> None:
    """--partition (or the type in --gres) -> `gpu_types`."""
    types = [t for t in (options.get("partition").split(",") if options.has("partition") else [gpu_type]) if t]
    if types:
        mapping["gpu_types"] = types


def _check_launcher_options(options: Options) -> None:
    """What rota.slurm.batch reads on the node, checked here so a bad value fails at submission."""
    if options.has("signal"):
        signal_of(options.get("signal"))
    if options.get("open-mode", "append") not in {"append", "truncate"}:
        raise DirectiveError(f"--open-mode: {options.get('open-mode')!r}: append or truncate")


def _limits(options: Options, mapping: dict[str, Any], tasks: int) -> None:
    """--mem, --cpus-per-task and --time onto the job limits' `memory`, `cpus`, `time_limit`
    (all per node: --cpus-per-task times the node's tasks)."""
    if not limits_supported():
        wanted = sorted(name for name in ("mem", "cpus-per-task") if options.has(name))
        if wanted:
            raise DirectiveError(f"--{wanted[0]}: this Rota has no job limits (the job file's cpus/memory/time_limit)")
        return  # --time is enforced by rota.slurm.batch alone
    if options.has("mem"):
        mapping["memory"] = memory_of(options.get("mem"))
    if options.has("cpus-per-task"):
        per_task = _number(options.get("cpus-per-task"), "--cpus-per-task", options.get("cpus-per-task"))
        if per_task < 1:
            raise DirectiveError("--cpus-per-task: must be at least 1")
        mapping["cpus"] = per_task * tasks
    if "duration" in mapping:
        mapping["time_limit"] = mapping["duration"]


def exports_of(text: str) -> dict[str, str]:
    """--export=NONE (the default here) or NAME[=VALUE],...: named variables of this shell.
    ALL, Slurm's default, is refused: a job file carries at most 64 variables."""
    import os

    if text.upper() == "NONE":
        return {}
    if text.upper().startswith("ALL"):
        raise DirectiveError("--export: ALL is not supported (a Rota job file carries named variables only); "
                             "name them: --export=VAR1,VAR2=value")
    env: dict[str, str] = {}
    for item in text.split(","):
        name, equals, value = item.partition("=")
        if not equals and name not in os.environ:
            raise DirectiveError(f"--export: {name} is not set in this shell")
        env[name] = value if equals else os.environ[name]
    return env
