"""What `rota bench checkpoint` reports (rota.bench.checkpoint runs the arms): a case's
times over its repeats (Case), their medians with min and max, the ratios against the best
baseline of the case, a restore's breakdown from the job's own marks, and the table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from rota.imagestore.chunks import MIB

# A restore's time: the process start and imports until restore() is called, waiting there
# for the agent's image (state transfer), reading and applying it (rebuild), the first step.
BREAKDOWN = ("process_start_s", "state_transfer_s", "rebuild_s", "first_step_s")
RESTORE_BASELINES = {"torch.load": "load_s", "torch.load(mmap)": "load_mmap_s",
                     "pre-started torch.load": "load_prestarted_copy_s",
                     "pre-started torch.load(mmap)": "load_prestarted_s", "safetensors": "safetensors_load_s",
                     "pre-started safetensors": "safetensors_prestarted_s"}
MIGRATE_BASELINES = {"torch.save + torch.load": ("save_s", "load_s"),
                     "torch.save + torch.load(mmap)": ("save_s", "load_mmap_s"),
                     "torch.save + pre-started torch.load": ("save_s", "load_prestarted_copy_s"),
                     "torch.save + pre-started torch.load(mmap)": ("save_s", "load_prestarted_s"),
                     "safetensors": ("safetensors_save_s", "safetensors_load_s"),
                     "safetensors, pre-started": ("safetensors_save_s", "safetensors_prestarted_s")}


@dataclass
class Case:
    state_mb: float
    ranks: int
    pause: list[float] = field(default_factory=list)
    restore: list[float] = field(default_factory=list)
    migrate: list[float] = field(default_factory=list)
    durable: list[float] = field(default_factory=list)
    save: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    load_mmap: list[float] = field(default_factory=list)
    load_prestarted: list[float] = field(default_factory=list)
    load_prestarted_copy: list[float] = field(default_factory=list)
    st_prestarted: list[float] = field(default_factory=list)
    st_save: list[float] = field(default_factory=list)
    st_load: list[float] = field(default_factory=list)
    dcp_async_block: list[float] = field(default_factory=list)
    breakdown: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in BREAKDOWN})
    phases: dict[str, float] = field(default_factory=dict)  # the bench's run time by phase, all repeats
    stored_bytes: int = 0
    baseline_bytes: int = 0

    def timed(self) -> dict[str, list[float]]:
        return {"pause_s": self.pause, "durable_s": self.durable, "restore_s": self.restore, "migrate_s": self.migrate,
                "save_s": self.save, "load_s": self.load, "load_mmap_s": self.load_mmap,
                "load_prestarted_s": self.load_prestarted, "load_prestarted_copy_s": self.load_prestarted_copy,
                "safetensors_save_s": self.st_save, "safetensors_load_s": self.st_load,
                "safetensors_prestarted_s": self.st_prestarted, "dcp_async_block_s": self.dcp_async_block}

    def to_dict(self) -> dict[str, Any]:
        m = {k: _median(v) for k, v in self.timed().items()}
        baseline: dict[str, Any] = {k: m[k] for k in ("save_s", "load_s", "load_mmap_s", "load_prestarted_s",
                                                       "load_prestarted_copy_s", "safetensors_save_s",
                                                       "safetensors_load_s", "safetensors_prestarted_s")}
        baseline["bytes"] = self.baseline_bytes
        restore_name, restore_best = best({n: m[k] for n, k in RESTORE_BASELINES.items()})
        migrate_name, migrate_best = best({n: m[a] + m[b] for n, (a, b) in MIGRATE_BASELINES.items()
                                           if m[a] > 0 and m[b] > 0})
        return {
            "state_mb": self.state_mb, "ranks": self.ranks, "pause_s": m["pause_s"], "durable_s": m["durable_s"],
            "restore_s": m["restore_s"], "migrate_s": m["migrate_s"], "stored_bytes": self.stored_bytes,
            "baseline": baseline, "dcp": {"async_block_s": m["dcp_async_block_s"]},
            "best_baseline": {"restore": restore_name, "restore_s": _round(restore_best),
                              "migrate": migrate_name, "migrate_s": _round(migrate_best)},
            "restore_x": _ratio(restore_best, m["restore_s"]), "migrate_x": _ratio(migrate_best, m["migrate_s"]),
            "restore_breakdown": {k: _median(v) for k, v in self.breakdown.items()},
            "repeats": len(self.pause), "phases_s": self.phases,
            "spread": {k: [_round(min(v)), _round(max(v))] for k, v in self.timed().items() if v},
        }


def best(times: dict[str, float]) -> tuple[str, float]:
    """The fastest measured baseline (0.0: not measured) and its time."""
    measured = {k: v for k, v in times.items() if v > 0}
    if not measured:
        return "", 0.0
    name = min(measured, key=lambda k: measured[k])
    return name, measured[name]


def _ratio(baseline: float, ours: float) -> float:
    return round(baseline / ours, 2) if ours > 0 and baseline > 0 else 0.0


def _round(value: float) -> float:
    return round(value, 4)


def _median(values: list[float]) -> float:
    return _round(statistics.median(values)) if values else 0.0


def add_breakdown(case: Case, report: dict[str, Any], launched_unix: float) -> None:
    """The restored job's own times (see rota.bench.checkpoint_job) as the four phases."""
    marks = [launched_unix, *(float(report.get(k, 0.0)) for k in ("t_restore", "t_ready", "t_loaded", "t_step"))]
    if not all(marks):
        return
    for name, (a, b) in zip(BREAKDOWN, zip(marks, marks[1:], strict=False), strict=True):
        case.breakdown[name].append(max(0.0, b - a))


def render(cases: list[dict[str, Any]]) -> str:
    """Medians with [min-max] beside each; x: the best baseline's time over ours (higher is better)."""
    def t(c: dict[str, Any], key: str, value: float) -> str:
        lo, hi = c.get("spread", {}).get(key, [value, value])
        return f"{value:.3f}s [{lo:.3f}-{hi:.3f}]"

    head = ("STATE", "RANKS", "PAUSE", "DCP.ASYNC", "DURABLE", "TORCH.SAVE", "RESTORE", "LOAD", "LOAD.MMAP",
            "PRE.LOAD", "PRE.MMAP", "ST.LOAD", "PRE.ST", "x", "MIGRATE", "BEST SAVE+LOAD", "x", "STORED", "FILE")
    rows = []
    for c in cases:
        b, bb = c["baseline"], c["best_baseline"]
        rows.append((
            f"{c['state_mb']:g} MB", c["ranks"], t(c, "pause_s", c["pause_s"]),
            t(c, "dcp_async_block_s", c["dcp"]["async_block_s"]), t(c, "durable_s", c["durable_s"]),
            t(c, "save_s", b["save_s"]), t(c, "restore_s", c["restore_s"]), t(c, "load_s", b["load_s"]),
            t(c, "load_mmap_s", b["load_mmap_s"]), t(c, "load_prestarted_copy_s", b["load_prestarted_copy_s"]),
            t(c, "load_prestarted_s", b["load_prestarted_s"]), t(c, "safetensors_load_s", b["safetensors_load_s"]),
            t(c, "safetensors_prestarted_s", b["safetensors_prestarted_s"]), f"{c['restore_x']:.2f}",
            t(c, "migrate_s", c["migrate_s"]), f"{bb['migrate_s']:.3f}s", f"{c['migrate_x']:.2f}",
            f"{c['stored_bytes'] / MIB:.1f} MiB", f"{b['bytes'] / MIB:.1f} MiB",
        ))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=True)) for r in (head, *rows)]
    lines.append("(medians [min-max] over the repeats; x: the best baseline's time over ours, higher is better: "
                 "RESTORE against the fastest loader, MIGRATE against the fastest save + load; 0.000s: not "
                 "measured; PRE: pre-started)")
    lines.append("best baselines: " + "; ".join(
        f"{c['state_mb']:g} MB x {c['ranks']}: restore {c['best_baseline']['restore']}, "
        f"migrate {c['best_baseline']['migrate']}" for c in cases))
    lines.append("restore breakdown (medians): " + "; ".join(
        f"{c['state_mb']:g} MB x {c['ranks']}: " + ", ".join(
            f"{k.removesuffix('_s').replace('_', ' ')} {v:.3f}s" for k, v in c["restore_breakdown"].items())
        for c in cases))
    return "\n".join(lines)
