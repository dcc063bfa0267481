"""`rota sim --render DIR`: pictures of a schedule, recomputed from its intervals alone.

The series use the definitions of `rota.sim.metrics`, so the last point of each equals the
summary figure of the table:

- U_u(t) = ∫_0^t Σ_{j of u running at s} n_j ds (from the intervals, overheads included),
- D_u(t) = ∫_0^t min(demand_u(s), Q_u) ds, demand_u(s) = Σ n_j of u's jobs submitted and
  not finished at s,
- F_u(t) = U_u(t) / D_u(t), undefined (a gap in the plot) while D_u(t) = 0; metrics'
  `ratio` reads that case as 1, but nothing was owed, so the plots leave it out.

Two readings of "F over time":

- **cumulative**, from the start of the trace to t: what the summary's tenant F is at the
  end of the run, so the lines converge on the table's figures;
- **sliding 24-hour window**, U and D over (t − 24 h, t]: close to what `fair` steers by
  (docs/design.md §4 reads hourly buckets over 24 h; here the window is exact rather than bucketed),
  and it shows the short-term swings that the cumulative curve averages away.

The figures show both, cumulative on top. Both are sampled at `points` evenly spaced
instants; each is computed exactly at those instants (integrals of step functions, with
numpy), so sampling only thins the curve, it does not approximate it.

Files written:
- `fairness_<policy>.png`: per-tenant F_u(t), cumulative and 24 h window, one line per tenant
  (same colour for a tenant in every policy's figure, same y axis in every figure);
- `fairness_max_min.png`: max F / min F over tenants (with D_u > 0) over time, one line per
  policy, cumulative and 24 h window;
- `jct_cdf.png`: the CDF of job completion time (end − submit) for every policy, log x.

numpy is imported here, matplotlib (Agg backend) only inside `render`, so the simulator and
its metrics load neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rota.core.fairness.ltgf import quotas
from rota.sim.metrics import JobRecord

Array = npt.NDArray[np.float64]

DAY_S = 86400.0
WINDOW_S = DAY_S
POINTS = 2000
# GPU-seconds below which D counts as zero (float noise in differences of running sums).
_EPS = 1e-6


def step_integral(times: Array, deltas: Array, at: Array, cap: float | None = None) -> Array:
    """∫_-∞^t min(level(s), cap) ds for each t in `at`, where level(s) is 0 before the first
    event and steps by `deltas[k]` at `times[k]` (several events may share a time)."""
    at = np.asarray(at, dtype=np.float64)
    if len(times) == 0:
        return np.zeros_like(at)
    order = np.argsort(times, kind="stable")
    e = np.asarray(times, dtype=np.float64)[order]
    level = np.cumsum(np.asarray(deltas, dtype=np.float64)[order])
    rate = level if cap is None else np.minimum(level, cap)
    # Running integral at each breakpoint; zero-length gaps between equal times add nothing.
    at_break = np.concatenate(([0.0], np.cumsum(np.diff(e) * rate[:-1])))
    k = np.searchsorted(e, at, side="right") - 1
    kk = np.maximum(k, 0)
    return np.where(k >= 0, at_break[kk] + rate[kk] * (at - e[kk]), 0.0)


def _columns(
    jobs: Sequence[JobRecord],
) -> tuple[list[str], Array, Array, Array, Array, Array, npt.NDArray[np.int64]]:
    """Per job: tenant, gpus, submit, end; per interval (all jobs' flattened): start, end
    and the index of its job."""
    tenants = [j.tenant for j in jobs]
    gpus = np.array([j.gpus for j in jobs], dtype=np.float64)
    submit = np.array([j.submit_s for j in jobs], dtype=np.float64)
    end = np.array([j.end_s for j in jobs], dtype=np.float64)
    counts = np.array([len(j.intervals) for j in jobs], dtype=np.int64)
    spans = np.array([iv for j in jobs for iv in j.intervals], dtype=np.float64).reshape(-1, 2)
    owner = np.repeat(np.arange(len(jobs), dtype=np.int64), counts)
    return tenants, gpus, submit, end, spans[:, 0], spans[:, 1], owner


def used_and_deserved(
    jobs: Sequence[JobRecord], shares: Mapping[str, float], gpus: int, at: Array
) -> dict[str, tuple[Array, Array]]:
    """Cumulative (U_u(t), D_u(t)) in GPU-seconds at each t of `at`, per tenant in `shares`."""
    quota = quotas(gpus, shares)
    names, n, submit, end, iv_start, iv_end, iv_owner = _columns(jobs)
    index = {t: k for k, t in enumerate(shares)}
    job_tenant = np.array([index.get(t, -1) for t in names], dtype=np.int64)
    iv_tenant, iv_gpus = job_tenant[iv_owner], n[iv_owner]
    out: dict[str, tuple[Array, Array]] = {}
    for t, k in index.items():
        mine = job_tenant == k
        demand_t = np.concatenate((submit[mine], end[mine]))
        demand_d = np.concatenate((n[mine], -n[mine]))
        runs = iv_tenant == k
        used_t = np.concatenate((iv_start[runs], iv_end[runs]))
        used_d = np.concatenate((iv_gpus[runs], -iv_gpus[runs]))
        out[t] = (
            step_integral(used_t, used_d, at),
            step_integral(demand_t, demand_d, at, cap=float(quota[t])),
        )
    return out


def sample_times(jobs: Sequence[JobRecord], points: int = POINTS) -> Array:
    """`points` instants evenly spaced from the first submit to the last end (both included)."""
    if not jobs:
        return np.zeros(0)
    t0 = min(j.submit_s for j in jobs)
    t1 = max(j.end_s for j in jobs)
    return np.linspace(t0, t1, max(points, 2))


def _f(used: Array, deserved: Array) -> Array:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(deserved > _EPS, used / np.where(deserved > _EPS, deserved, 1.0), np.nan)


def fairness_over_time(
    jobs: Sequence[JobRecord],
    shares: Mapping[str, float],
    gpus: int,
    at: Array,
    window_s: float | None = None,
) -> dict[str, Array]:
    """Per-tenant F_u at each t of `at`: cumulative from the start when `window_s` is None,
    else U and D over (t − window_s, t]. NaN where D = 0 (nothing deserved yet, or in the
    window). Tenants that never deserve anything are left out, as in `tenant_fairness`."""
    at = np.asarray(at, dtype=np.float64)
    ud = used_and_deserved(jobs, shares, gpus, at)
    if window_s is not None:
        before = used_and_deserved(jobs, shares, gpus, at - window_s)
        ud = {t: (u - before[t][0], d - before[t][1]) for t, (u, d) in ud.items()}
    return {t: _f(u, d) for t, (u, d) in ud.items() if np.any(d > _EPS)}


def max_over_min(f: Mapping[str, Array]) -> Array:
    """max F / min F over the tenants defined (not NaN) at each instant: +inf where some
    tenant owed GPU-time has had none (min F = 0 < max F), NaN where no tenant is defined
    or every defined F is 0."""
    if not f:
        return np.zeros(0)
    m = np.vstack(list(f.values()))
    defined = ~np.isnan(m)
    hi = np.where(defined, m, -np.inf).max(axis=0)
    lo = np.where(defined, m, np.inf).min(axis=0)
    ok = defined.any(axis=0) & (hi > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), np.inf), np.nan)


def jct_cdf(jobs: Sequence[JobRecord]) -> tuple[Array, Array]:
    """(sorted JCTs in seconds, fraction of jobs done within each): the empirical CDF."""
    jct = np.sort(np.array([j.end_s - j.submit_s for j in jobs], dtype=np.float64))
    return jct, np.arange(1, len(jct) + 1, dtype=np.float64) / max(len(jct), 1)


def _pow2_label(x: float) -> str:
    return f"{x:g}" if x >= 1 else f"1/{round(1 / x)}"


def _log2_ticks(lo: float, hi: float) -> list[float]:
    return [2.0**k for k in range(round(np.log2(lo)), round(np.log2(hi)) + 1)]


def _ratio_axis(ax: Any, lo: float, hi: float) -> None:
    """Log-2 y axis from lo to hi (powers of two); the end labels read ≤ lo and ≥ hi, since
    the curves are clipped to the range."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    ticks = _log2_ticks(lo, hi)
    labels = [_pow2_label(x) for x in ticks]
    if lo < 1:
        labels[0] = "≤" + labels[0]
    labels[-1] = "≥" + labels[-1]
    ax.set_yscale("log", base=2)
    ax.set_ylim(lo, hi)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FixedFormatter(labels))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", zorder=1)
    ax.grid(True, which="major", axis="both", alpha=0.3)


def _limits(series: Sequence[Array], floor: float, ceil: float) -> tuple[float, float]:
    """Power-of-two y limits covering the defined, positive, finite values, kept within
    [floor, ceil] and always including 1 (values outside are drawn clipped at the edge)."""
    vals = np.concatenate([s[np.isfinite(s) & (s > 0)] for s in series] or [np.ones(1)])
    if len(vals) == 0:
        return max(floor, 0.5), 2.0
    lo = float(np.clip(vals.min(), floor, 1.0))
    hi = float(np.clip(vals.max(), 1.0, ceil))
    return 2.0 ** np.floor(np.log2(lo)), max(2.0 ** np.ceil(np.log2(hi)), 2.0)


# Human marks for the JCT axis, in hours.
_JCT_TICKS = [
    (1 / 60, "1 min"),
    (10 / 60, "10 min"),
    (1, "1 h"),
    (6, "6 h"),
    (24, "1 d"),
    (168, "1 wk"),
    (720, "30 d"),
    (2160, "90 d"),
]
# Colour range of the 24 h heatmap, in log2 F: 1/16 .. 16.
_HEAT_LOG2 = 4


def render(
    out_dir: Path,
    runs: Mapping[str, Sequence[JobRecord]],
    shares: Mapping[str, float],
    gpus: int,
    *,
    points: int = POINTS,
    window_s: float = WINDOW_S,
) -> list[Path]:
    """Write the figures for every policy in `runs` into `out_dir`; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize
    from matplotlib.ticker import NullLocator

    out_dir.mkdir(parents=True, exist_ok=True)
    quota = quotas(gpus, shares)
    # Tenants by share, largest first; ten distinct colours, then the same ones dashed.
    tenants = sorted(shares, key=lambda t: (-shares[t], t))
    palette = plt.get_cmap("tab10")
    colour = {t: palette(k % 10) for k, t in enumerate(tenants)}
    dashes = {t: "-" if k < 10 else "--" for k, t in enumerate(tenants)}
    label = {t: f"{t} (Q={quota[t]})" for t in tenants}
    window_h = f"{window_s / 3600:g} h"

    series: dict[str, tuple[Array, dict[str, Array], dict[str, Array]]] = {}
    for name, jobs in runs.items():
        at = sample_times(jobs, points)
        series[name] = (
            at,
            fairness_over_time(jobs, shares, gpus, at),
            fairness_over_time(jobs, shares, gpus, at, window_s),
        )
    # One y range for all policies, so the figures compare at a glance.
    cum_lim = _limits([f for _, c, _ in series.values() for f in c.values()], 1 / 64, 64)
    xmax = max((float(at[-1]) / DAY_S for at, _, _ in series.values() if len(at)), default=1.0)
    heat_cmap = plt.get_cmap("RdBu").with_extremes(bad="#b0b0b0")
    heat_norm = Normalize(-_HEAT_LOG2, _HEAT_LOG2)

    def save(fig: Any, name: str) -> Path:
        path = out_dir / name
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return path

    look = _Look(tenants, colour, dashes, label, window_h, cum_lim, xmax, heat_cmap, heat_norm)
    written: list[Path] = []
    for name, (at, cum, win) in series.items():
        fig = _fairness_figure(plt, look, name, at, cum, win, gpus)
        written.append(save(fig, f"fairness_{name}.png"))

    # max F / min F over time, every policy on one figure.
    pol_colour = {name: palette(k % 10) for k, name in enumerate(runs)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 9), sharex=True)
    for ax, windowed, what, ceil in (
        (top, False, "cumulative from t = 0", 64.0),
        (bottom, True, f"sliding {window_h} window", 256.0),
    ):
        curves = {name: max_over_min(w if windowed else c) for name, (_, c, w) in series.items()}
        _, hi = _limits(list(curves.values()), 1.0, ceil)
        if any(np.isinf(r).any() for r in curves.values()):
            hi = ceil
        for name, r in curves.items():
            at = series[name][0]
            end = f" (end {r[-1]:.2f})" if not windowed and len(r) and np.isfinite(r[-1]) else ""
            ax.plot(
                at / DAY_S,
                np.clip(r, 1.0, hi),
                color=pol_colour[name],
                linewidth=0.8 if windowed else 1.5,
                label=f"{name}{end}",
                zorder=3 if name == "fair" else 2,
            )
        _ratio_axis(ax, 1.0, hi)
        ax.set_ylabel("max F / min F over tenants (log scale)")
        ax.set_title(
            f"{what}; at the top edge: ≥ {hi:g}, or some tenant owed GPU-time has had none (min F = 0)",
            fontsize=10,
            loc="left",
        )
    bottom.set_xlabel("simulated time (days)")
    bottom.set_xlim(0, xmax)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, title="policy", frameon=False)
    fig.suptitle(
        f"Spread of tenant fairness over time, {gpus} GPUs (1 = every tenant served alike)", fontsize=12
    )
    fig.tight_layout()
    written.append(save(fig, "fairness_max_min.png"))

    # JCT CDFs.
    written.append(save(_jct_figure(plt, NullLocator, runs, pol_colour, gpus), "jct_cdf.png"))
    return written


@dataclass(frozen=True)
class _Look:
    """What every policy's fairness figure shares: tenants' order, colours and labels, and the axes' ranges."""

    tenants: list[str]
    colour: dict[str, Any]
    dashes: dict[str, str]
    label: dict[str, str]
    window_h: str
    cum_lim: tuple[float, float]
    xmax: float
    heat_cmap: Any
    heat_norm: Any


def _fairness_figure(plt: Any, look: _Look, name: str, at: Array, cum: dict[str, Array], win: dict[str, Array],
                     gpus: int) -> Any:
    """One policy's figure: each tenant's cumulative F above, its sliding-window F as a heatmap below."""
    tenants, colour, dashes, label, window_h = look.tenants, look.colour, look.dashes, look.label, look.window_h
    cum_lim, xmax, heat_cmap, heat_norm = look.cum_lim, look.xmax, look.heat_cmap, look.heat_norm
    days = at / DAY_S
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(13, 9), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    for t in tenants:
        if t in cum:
            top.plot(
                days,
                np.clip(cum[t], *cum_lim),
                color=colour[t],
                linestyle=dashes[t],
                linewidth=1.4,
                label=label[t],
            )
    _ratio_axis(top, *cum_lim)
    top.set_ylabel("tenant F = U / D (log scale)")
    top.set_title(
        "cumulative from t = 0: U and D summed since the start (the table's F at the end)",
        fontsize=10,
        loc="left",
    )
    top.legend(
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=9,
        title="tenant (quota, GPUs)",
        title_fontsize=9,
        frameon=False,
    )
    # Sliding window: one row per tenant, colour = log2 F (red under-served, blue over).
    rows = [t for t in tenants if t in win]
    # F = 0 (owed, had none) sits at the bottom of the scale; NaN (nothing owed) stays grey.
    floor = 2.0 ** -(_HEAT_LOG2 + 1)
    grid = (
        np.vstack([np.log2(np.where(win[t] == 0, floor, win[t])) for t in rows])
        if rows
        else np.full((1, len(at)), np.nan)
    )
    step = (days[1] - days[0]) / 2 if len(days) > 1 else 0.5
    im = bottom.imshow(
        np.ma.masked_invalid(grid),
        aspect="auto",
        interpolation="nearest",
        cmap=heat_cmap,
        norm=heat_norm,
        extent=(days[0] - step, days[-1] + step, len(rows) - 0.5, -0.5),
    )
    bottom.set_yticks(range(len(rows)), [label[t] for t in rows], fontsize=8)
    bottom.set_title(
        f"sliding {window_h} window: U and D over (t − {window_h}, t]; grey = nothing owed in the window",
        fontsize=10,
        loc="left",
    )
    cax = bottom.inset_axes((1.01, 0.0, 0.015, 1.0))
    ticks = list(range(-_HEAT_LOG2, _HEAT_LOG2 + 1))
    bar = fig.colorbar(im, cax=cax, ticks=ticks)
    bar.ax.set_yticklabels(
        [("≤" if k == ticks[0] else "≥" if k == ticks[-1] else "") + _pow2_label(2.0**k) for k in ticks],
        fontsize=8,
    )
    bar.set_label("F (red: under-served)", fontsize=8)
    bottom.set_xlabel("simulated time (days)")
    bottom.set_xlim(0, xmax)
    final = max_over_min({t: f[-1:] for t, f in cum.items()})
    tail = f"; at the end max F / min F = {final[0]:.2f}" if len(final) and np.isfinite(final[0]) else ""
    fig.suptitle(
        f"{name}: per-tenant fairness F = used / deserved GPU-time, {gpus} GPUs{tail}", fontsize=12
    )
    fig.tight_layout()
    return fig


def _jct_figure(plt: Any, NullLocator: Any, runs: Mapping[str, Sequence[JobRecord]], pol_colour: dict[str, Any],
                gpus: int) -> Any:
    """Every policy's CDF of job completion times on one figure."""
    fig, ax = plt.subplots(figsize=(11, 6.5))
    lo_h = np.inf
    for name, jobs in runs.items():
        x, y = jct_cdf(jobs)
        if not len(x):
            continue
        hours = np.maximum(x, 1.0) / 3600
        lo_h = min(lo_h, float(hours[0]))
        ax.step(
            hours,
            y,
            where="post",
            color=pol_colour[name],
            linewidth=1.4,
            label=f"{name}: avg {x.mean() / 3600:.1f} h, median {np.median(x) / 3600:.2f} h",
        )
    ax.set_xscale("log")
    ax.set_ylim(0, 1.0)
    if np.isfinite(lo_h):
        ax.set_xlim(left=lo_h / 1.5)
    secondary = ax.secondary_xaxis("top")
    secondary.set_xticks([h for h, _ in _JCT_TICKS], [s for _, s in _JCT_TICKS], fontsize=8)
    secondary.xaxis.set_minor_locator(NullLocator())
    for h, _ in _JCT_TICKS:
        ax.axvline(h, color="grey", linewidth=0.5, alpha=0.3)
    ax.set_xlabel("job completion time, end − submit (hours, log scale)")
    ax.set_ylabel("fraction of jobs completed within")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9, title="policy", frameon=True)
    n = max((len(j) for j in runs.values()), default=0)
    ax.set_title(f"JCT CDF, {gpus} GPUs, {n:,} jobs", fontsize=12)
    fig.tight_layout()
    return fig
