"""Bubble windows of a pipeline stage, from its own timestamps, and a trial squeezed into them.

A stage marks the edges of its compute: :meth:`BubbleClock.compute_start` when a forward or
backward of a microbatch (or the optimizer step) begins, :meth:`BubbleClock.compute_end`
when it ends. Everything between two compute intervals of one step is a bubble window: the
stage waits for a neighbour (GPipe's fill and drain, or a slow link).

When a co-located trial process is given (``squeeze_pid``, or process groups in
``squeeze_pgids``: the guests an agent placed in this job's bubbles, from
``rota.runtime.bubble_guests()``), the clock resumes it with SIGCONT at a compute end and
stops it with SIGSTOP at the next compute start, so the trial runs only inside bubbles; a
stopped process keeps its whole state and resumes exactly where it was.
Only windows predicted to be long enough are used (``min_squeeze_s``; the prediction is the
same window of the previous step, since a schedule repeats its bubbles every step): on a
short one the edges' signals and wake-ups would cost the stage more than the trial gains.

The busy fraction of the stage's core inside bubble windows (the CPU's stand-in for a GPU's
SM activity) is measured from the CPU time the stage process (``CLOCK_PROCESS_CPUTIME_ID``)
and the trial (``/proc/PID/schedstat``, nanoseconds) spent inside the windows.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["BubbleClock", "EdgeMarker", "task_cpu_ns"]


def task_cpu_ns(pid: int) -> int:
    """CPU time of a process's main thread, in ns (the first field of /proc/PID/schedstat)."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as f:
        return int(f.read().split()[0])


@dataclass
class BubbleClock:
    """Compute intervals and bubble windows of one stage; optionally squeezes a trial process into the bubbles."""

    squeeze_pid: int | None = None
    squeeze_pgids: tuple[int, ...] = ()  # guests' process groups (their CPU time is not measured)
    watch_pid: int | None = None  # a co-located process whose CPU time counts as busy (naive arm)
    min_bubble_s: float = 0.0002
    min_squeeze_s: float = 0.004
    clock: Callable[[], float] = time.perf_counter
    compute: list[tuple[float, float]] = field(default_factory=list)
    bubbles: list[tuple[float, float, float]] = field(default_factory=list)  # start, end, busy fraction
    resumed: list[tuple[float, float]] = field(default_factory=list)  # windows the trial was let run in
    _start: float | None = None
    _gap: tuple[float, int, int] | None = None
    _resumed: bool = False
    _previous: list[float] = field(default_factory=list)  # last step's gap lengths, in order
    _current: list[float] = field(default_factory=list)
    recording: bool = True

    def _other_cpu(self) -> int:
        pid = self.squeeze_pid or self.watch_pid
        if pid is None:
            return 0
        try:
            return task_cpu_ns(pid)
        except OSError:
            return 0

    def _signal(self, sig: signal.Signals) -> None:
        if self.squeeze_pid is not None:
            os.kill(self.squeeze_pid, sig)
        self._signal_groups(sig)

    def _signal_groups(self, sig: signal.Signals) -> None:
        for group in self.squeeze_pgids:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass  # the guest ended (or was stopped by its agent) meanwhile

    def release(self) -> None:
        """Lets the guests run freely (at this job's end: none may be left stopped)."""
        self._signal_groups(signal.SIGCONT)

    @property
    def _squeezing(self) -> bool:
        return self.squeeze_pid is not None or bool(self.squeeze_pgids)

    def compute_start(self) -> None:
        if self._resumed and self._squeezing:
            self._signal(signal.SIGSTOP)
        now = self.clock()
        if self._resumed and self._gap is not None and self.recording:
            self.resumed.append((self._gap[0], now))
        self._resumed = False
        if self._gap is not None:
            started, own, other = self._gap
            wall = now - started
            self._current.append(wall)
            if wall >= self.min_bubble_s and self.recording:
                busy = (time.process_time_ns() - own + self._other_cpu() - other) / 1e9
                self.bubbles.append((started, now, min(1.0, busy / wall)))
        self._gap = None
        self._start = now

    def compute_end(self) -> None:
        now = self.clock()
        if self._start is not None and self.recording:
            self.compute.append((self._start, now))
        self._start = None
        self._gap = (now, time.process_time_ns(), self._other_cpu())
        index = len(self._current)
        predicted = self._previous[index] if index < len(self._previous) else 0.0
        if self._squeezing and predicted >= self.min_squeeze_s:
            self._resumed = True
            self._signal(signal.SIGCONT)

    def step_boundary(self) -> None:
        """The end of a step: the gap until the next step's first compute is not a bubble of this step."""
        self._gap = None
        self._previous, self._current = self._current, []

    def busy_fraction(self) -> float | None:
        total = sum(e - s for s, e, _ in self.bubbles)
        if total <= 0:
            return None
        return sum((e - s) * b for s, e, b in self.bubbles) / total

    def summary(self) -> dict[str, Any]:
        return {"bubble_s": sum(e - s for s, e, _ in self.bubbles), "compute_s": sum(e - s for s, e in self.compute),
                "bubble_busy": self.busy_fraction(), "windows": len(self.bubbles)}


class _Edge(torch.autograd.Function):
    """Identity whose backward calls a callback: marks when gradients reach a point of the graph."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, callback: Callable[[], None]) -> torch.Tensor:
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.callback()
        return grad, None


class EdgeMarker(torch.nn.Module):
    """Wraps a stage's module so its forward and backward compute edges reach a :class:`BubbleClock`.

    The backward of the output edge runs first in the stage's backward (compute starts), the
    backward of the input edge last (compute ends). The input is made a leaf that requires a
    gradient so the input edge fires on the first stage too (one extra input-gradient matmul).
    """

    def __init__(self, module: torch.nn.Module, clock: BubbleClock) -> None:
        super().__init__()
        self.module = module
        self.clock = clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.compute_start()
        if not x.requires_grad:
            x = x.detach().requires_grad_(True)
        x = _Edge.apply(x, self.clock.compute_end)
        out = _Edge.apply(self.module(x), self.clock.compute_start)
        self.clock.compute_end()
        return out  # type: ignore[no-any-return]
