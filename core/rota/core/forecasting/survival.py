"""Expected durations for ordering jobs, with the jobs still running counted (pure).

Shortest-job-first minimises the mean completion time when jobs are ordered by their
*expected* duration (Smith's rule), not by their median: with heavy-tailed run times
the two differ by an order of magnitude, and most for the jobs whose declared limit
says least (those at the queue's maximum, which long and short jobs alike declare).

Past jobs that declared the same limit are the evidence (as in
`rota.core.forecasting.history`), but at any submission the ones that have finished are
the short ones: the long ones are still running. So the mean is the Kaplan–Meier
restricted mean (Kaplan & Meier, JASA 1958): finished jobs are events at their run
time, running ones are censored at their age (time since submission; a lower bound of
their run time where jobs start on submission, about it where they queue briefly).
Where fewer than `min_same` jobs of that limit have finished, the caller's fallback
stands (the history model's P50). A caller that knows more about a job than its limit
(its user or group, say) may pass `keys`: the jobs pooled are then those of the same key
(None: the job is left to its fallback).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from rota.core.forecasting.history import Past


def restricted_mean(events: Iterable[float], censored: Iterable[float] = ()) -> float | None:
    """The Kaplan–Meier mean up to the longest time seen (None: no event).

    `events` are observed durations, `censored` durations known only to exceed the value.
    """
    ev = np.asarray(list(events), float)
    ce = np.asarray(list(censored), float)
    if ev.size == 0:
        return None
    t = np.concatenate([ev, ce])
    d = np.concatenate([np.ones(ev.size), np.zeros(ce.size)])
    order = np.lexsort((-d, t))  # by time; at a tie the event first (censored ones were at risk)
    t, d = t[order], d[order]
    at_risk = t.size - np.arange(t.size)
    surv = np.cumprod(1.0 - d / at_risk)
    before = np.concatenate([[1.0], surv[:-1]])
    return float(np.sum(before * np.diff(np.concatenate([[0.0], t]))))


def expected_durations(jobs: Sequence[Past], fallback: Sequence[float], min_same: int = 5,
                       keys: Sequence[Hashable | None] | None = None) -> list[float]:
    """Each job's expected duration at its submission, from the jobs of its key (default: its
    declared limit) submitted before it: finished ones as events, running ones censored at their age."""
    if len(fallback) != len(jobs):
        raise ValueError(f"fallback: must have one value per job ({len(jobs)}, got {len(fallback)})")
    if keys is not None and len(keys) != len(jobs):
        raise ValueError(f"keys: must have one key per job ({len(jobs)}, got {len(keys)})")
    key_of = list(keys) if keys is not None else [j.declared for j in jobs]
    groups: dict[Hashable, list[int]] = {}
    for i in sorted(range(len(jobs)), key=lambda i: (jobs[i].submit_s, i)):
        key = key_of[i]
        if key is not None:
            groups.setdefault(key, []).append(i)
    out = [float(v) for v in fallback]
    for members in groups.values():
        for k, i in enumerate(members):
            now = jobs[i].submit_s
            events = [jobs[j].seconds for j in members[:k] if jobs[j].finish_s <= now]
            if len(events) < min_same:
                continue
            censored = [now - jobs[j].submit_s for j in members[:k]
                        if jobs[j].finish_s > now and jobs[j].submit_s < now]
            mean = restricted_mean(events, censored)
            if mean is not None:
                out[i] = mean
    return out
