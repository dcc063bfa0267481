"""Plan grids as pictures: text for a terminal, PNG for a page (the post's figure).

Rows are GPUs, columns timesteps; a colour (or a letter) per job with its id, realtime
apps hatched (lower-case letters), idle white ('.'). Several grids of the same cluster
(FIFO above fast, say) stack one above the other with one shared legend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

Cells = Sequence[Sequence[str | None]]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _job_ids(grids: Mapping[str, Cells]) -> list[str]:
    seen: dict[str, None] = {}
    for grid in grids.values():
        for row in grid:
            for cell in row:
                if cell:
                    seen.setdefault(cell, None)
    return list(seen)


def text(grids: Mapping[str, Cells], *, labels: Sequence[str] | None = None, realtime: set[str] | frozenset[str] = frozenset(),
         title: str = "") -> str:
    ids = _job_ids(grids)
    batch = [i for i in ids if i not in realtime]
    sym = {job_id: LETTERS[k % len(LETTERS)] for k, job_id in enumerate(batch)}
    sym.update({job_id: "abcdefghijklmnopqrstuvwxyz"[k % 26] for k, job_id in enumerate(i for i in ids if i in realtime)})
    sym["*"] = "*"
    lines = [title] if title else []
    for name, grid in grids.items():
        width = max((len(x) for x in labels or ()), default=4)
        lines.append(f"\n{name}" if name else "")
        for g, row in enumerate(grid):
            label = labels[g] if labels else str(g)
            lines.append(f"{label:>{width}} " + "".join(sym.get(c, "?") if c else "." for c in row))
    legend = "  ".join(f"{sym[i]}={i}" for i in ids if i != "*")
    lines.append("\n" + legend if legend else "\n(no jobs in the plan)")
    return "\n".join(lines).lstrip("\n") + "\n"


def png(path: Path, grids: Mapping[str, Cells], *, labels: Sequence[str] | None = None,
        realtime: set[str] | frozenset[str] = frozenset(), title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    ids = [i for i in _job_ids(grids) if i != "*"]
    cmap = plt.get_cmap("tab20")
    colour = {job_id: cmap(k % 20) for k, job_id in enumerate(ids)}
    colour["*"] = (0.75, 0.75, 0.75, 1.0)
    rows = max(len(g) for g in grids.values())
    steps = max((len(r) for g in grids.values() for r in g), default=1)
    fig, axes = plt.subplots(len(grids), 1, squeeze=False, figsize=(min(4 + steps * 0.45, 24), 1.5 + len(grids) * min(0.3 * rows + 0.8, 12)))
    for ax, (name, grid) in zip(axes[:, 0], grids.items(), strict=True):
        for g, row in enumerate(grid):
            t = 0
            while t < len(row):  # one rectangle per run of a job along the row
                cell, end = row[t], t + 1
                while end < len(row) and row[end] == cell:
                    end += 1
                if cell:
                    ax.add_patch(Rectangle((t, g), end - t, 1, facecolor=colour[cell], edgecolor="white", linewidth=0.5,
                                           hatch="//" if cell in realtime else None))
                    if end - t >= 3 and rows <= 64:
                        ax.text((t + end) / 2, g + 0.5, cell, ha="center", va="center", fontsize=6)
                t = end
        ax.set_xlim(0, steps)
        ax.set_ylim(len(grid), 0)
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_xlabel("step")
        if labels and rows <= 64:
            ax.set_yticks([g + 0.5 for g in range(len(grid))], labels[: len(grid)], fontsize=6)
        else:
            ax.set_ylabel("GPU")
    handles = [Patch(facecolor=colour[i], hatch="//" if i in realtime else None, label=i) for i in ids[:40]]
    if handles:
        fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.85 if handles else 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
