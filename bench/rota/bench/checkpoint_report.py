"""The table `rota bench checkpoint` prints (rota.bench.checkpoint): medians with their
min and max, and the ratios against the best baseline."""

from __future__ import annotations

from typing import Any

from rota.imagestore.chunks import MIB


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
