"""Trials placed into the pipeline bubbles of running jobs (Hydro's bubble squeezing, docs/design.md §8).

A running job that reports its bubbles through ``rota.runtime`` (``step_s`` and
``bubble_s`` of its last step: the time its stage waited on a neighbour) is a *bubble
host*. A ``kind: trial`` job the plan could not start on free GPUs this step may run as its
*guest*: on the host's GPUs, at idle priority and let run only inside the host's bubbles
(the host's stage stops it at each compute start and resumes it at each compute end), so
the host loses no step time and the trial gets the share of the GPU the host leaves idle.

Free GPUs come first: the plan runs before this, and only the trials it left waiting (or
planned for a later step) are candidates. Each GPU takes one guest at most, and a guest
takes GPUs of one host on one node. A trial that says how much GPU memory it needs
(`gpu_memory_mb`) goes only beside a stage that reports at least that much free
(``bubble_free_mb``); one that says nothing is taken to fit. Pure: plain data in, plain
data out, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

# Ours: a host whose stage waits less than this share of its step leaves too little room
# for a trial to be worth the signals and the memory it takes beside the stage.
MIN_BUBBLE_FRACTION = 0.2


@dataclass(frozen=True)
class BubbleHost:
    """A running job with bubbles: its GPUs on one node, those already lent, its bubble share."""

    job_id: str
    node: str
    gpus: tuple[int, ...]
    bubble_fraction: float
    lent: frozenset[int] = frozenset()
    gpu_type: str = ""
    free_mb: float | None = None  # GPU memory its stage leaves free, per GPU (None: not reported)


@dataclass(frozen=True)
class GuestCandidate:
    """A waiting trial: how many GPUs it needs, the types it accepts (empty: any), and the
    memory it needs on each (0: not said)."""

    job_id: str
    gpus: int
    priority: int = 0
    gpu_types: tuple[str, ...] = ()
    memory_mb: int = 0


@dataclass(frozen=True)
class GuestStart:
    job_id: str
    host_job_id: str
    node: str
    gpus: tuple[int, ...]
    bubble_fraction: float


def bubble_fraction(progress: dict[str, object]) -> float | None:
    """A host's bubble share from its last report (bubble_s over step_s), or None when the
    job reports no bubbles (or nonsense: a share outside [0, 1] is not believed)."""
    step, bubble = progress.get("step_s"), progress.get("bubble_s")
    if not isinstance(step, (int, float)) or not isinstance(bubble, (int, float)) or isinstance(step, bool):
        return None
    if step <= 0 or not 0 <= bubble <= step:
        return None
    return float(bubble) / float(step)


def free_memory_mb(progress: dict[str, object]) -> float | None:
    """The GPU memory a host's stage leaves free (``bubble_free_mb``), or None when it does
    not say (or says something that is not a non-negative number)."""
    value = progress.get("bubble_free_mb")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        return None
    return float(value)


def fits(trial: GuestCandidate, host: BubbleHost) -> bool:
    """Whether the trial's declared memory fits beside the host's stage: a trial that said
    nothing fits anywhere; one that did, only where the stage reports at least that free."""
    if trial.memory_mb <= 0:
        return True
    return host.free_mb is not None and host.free_mb >= trial.memory_mb


def place_guests(hosts: list[BubbleHost], candidates: list[GuestCandidate],
                 min_fraction: float = MIN_BUBBLE_FRACTION) -> list[GuestStart]:
    """Guests for the waiting trials, highest priority first (then in the order given: the
    queue's), each on the host with the largest bubble share that has enough unlent GPUs
    of a type it accepts; the lowest-numbered free GPUs of that host."""
    free = {h.job_id: [g for g in sorted(h.gpus) if g not in h.lent] for h in hosts
            if h.bubble_fraction >= min_fraction}
    ranked = sorted((h for h in hosts if h.job_id in free), key=lambda h: (-h.bubble_fraction, h.job_id))
    starts: list[GuestStart] = []
    order = sorted(range(len(candidates)), key=lambda i: (-candidates[i].priority, i))
    for trial in (candidates[i] for i in order):
        if trial.gpus <= 0:
            continue
        for host in ranked:
            gpus = free[host.job_id]
            if len(gpus) < trial.gpus or (trial.gpu_types and host.gpu_type not in trial.gpu_types) \
                    or not fits(trial, host):
                continue
            taken, free[host.job_id] = tuple(gpus[:trial.gpus]), gpus[trial.gpus:]
            starts.append(GuestStart(trial.job_id, host.job_id, host.node, taken, host.bubble_fraction))
            break
    return starts
