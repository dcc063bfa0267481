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


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
