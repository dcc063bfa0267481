"""What an agent declares about its node: its GPUs' type (--gpu-type, else
ROTA_AGENT_GPU_TYPE) and its labels (--label KEY=VALUE, repeated, else ROTA_AGENT_LABELS).

The flags replace the variable rather than merge with it, as every other agent flag does
(--api over ROTA_API_ADDR). A bad value stops the agent before it registers, with a line
naming the flag or variable it came from: a node registered with a typo would take jobs
meant for another type or switch.
"""

from __future__ import annotations

import argparse

from rota.common.config import Settings
from rota.core.nodelabels import MAX_LABELS, parse_label, parse_labels, type_problem
from rota.core.quantities import MAX_CPUS, parse_memory


def gpu_type_arg(text: str) -> str:
    """argparse's `type` of --gpu-type: argparse then names the flag in its error."""
    problem = type_problem(text.strip())
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text.strip()


def label_arg(text: str) -> tuple[str, str]:
    """argparse's `type` of --label KEY=VALUE."""
    try:
        return parse_label(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cpus_arg(text: str) -> float:
    """argparse's `type` of --cpus: a positive number of CPUs."""
    try:
        cpus = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of CPUs: {text!r}") from None
    if not 0 < cpus <= MAX_CPUS:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_CPUS:g} (got {text})")
    return cpus


def memory_arg(text: str) -> int:
    """argparse's `type` of --memory: a quantity such as 64Gi."""
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def capacity(args: argparse.Namespace, meminfo: str, cpu_count: int) -> tuple[float, int]:
    """(CPUs, memory bytes) jobs may reserve on the node: the flags', else what the machine
    has (`cpu_count`, /proc/meminfo's MemTotal; 0 when unreadable: nothing is checked)."""
    cpus = args.cpus if getattr(args, "cpus", None) is not None else float(cpu_count)
    memory = getattr(args, "memory", None)
    if memory is None:
        memory = 0
        for line in meminfo.splitlines():
            if line.startswith("MemTotal:") and line.split()[1].isdigit():
                memory = int(line.split()[1]) * 1024  # the kernel says kB, meaning KiB
    return cpus, memory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpus", type=cpus_arg, default=None, metavar="N",
                        help="CPUs jobs' `cpus` may reserve on the node (default: the machine's)")
    parser.add_argument("--memory", type=memory_arg, default=None, metavar="QUANTITY",
                        help="memory jobs' `memory` may reserve on the node, e.g. 64Gi (default: MemTotal)")
    parser.add_argument("--gpu-type", type=gpu_type_arg, default=None, metavar="TYPE",
                        help="the GPUs' type, e.g. a100 (default: ROTA_AGENT_GPU_TYPE; on real GPUs the type "
                             "nvidia-smi's model name says, on virtual slots none)")
    parser.add_argument("--label", type=label_arg, action="append", default=None, metavar="KEY=VALUE",
                        help="a label of the node, e.g. switch=s1 (repeatable; default: ROTA_AGENT_LABELS, "
                             "e.g. 'switch=s1,rack=r1')")


def declared(args: argparse.Namespace, settings: Settings) -> tuple[str, dict[str, str]]:
    """(GPU type, labels): the flags', else the environment's; ValueError naming the source."""
    if args.gpu_type is not None:
        gpu_type = args.gpu_type
    else:
        gpu_type = settings.agent_gpu_type
        problem = type_problem(gpu_type)
        if problem is not None:
            raise ValueError(f"ROTA_AGENT_GPU_TYPE: {problem}")
    labels: dict[str, str] = {}
    if args.label is not None:
        source = "--label"
        for key, value in args.label:
            if key in labels:
                raise ValueError(f"--label: {key!r} given twice")
            labels[key] = value
    else:
        source = "ROTA_AGENT_LABELS"
        try:
            labels = parse_labels(settings.agent_labels)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{source}: at most {MAX_LABELS} labels (got {len(labels)})")
    return gpu_type, labels
