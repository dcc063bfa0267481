"""The README is the guide and bench/README.md holds the figures: the README's benchmark
section keeps one table, the commands with what each measures; every table of figures in
bench/README.md sits in a section that gives the command that made it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def sections(text: str, level: str = "## ") -> dict[str, str]:
    """Each heading of `level` (outside code blocks) with the text up to the next one."""
    out: dict[str, str] = {}
    heading, lines, in_code = "", [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith(level):
            out[heading] = "\n".join(lines)
            heading, lines = line[len(level):], []
        else:
            lines.append(line)
    out[heading] = "\n".join(lines)
    return out


def table_headers(text: str) -> list[str]:
    """The header row of every markdown table in `text`."""
    lines = text.splitlines()
    return [lines[i - 1] for i, line in enumerate(lines) if i and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip())]


def test_the_readmes_benchmark_section_lists_commands_and_no_figures() -> None:
    readme = (REPO / "README.md").read_text()
    bench = sections(readme)["Benchmarks and simulator"]
    assert table_headers(bench) == ["| command | what it measures |"]
    assert "bench/README.md" in bench
    assert not any(h.startswith("| figure") for h in table_headers(readme)), "figures belong in bench/README.md"


def test_every_table_of_figures_in_bench_readme_comes_with_its_command() -> None:
    found = sections((REPO / "bench" / "README.md").read_text())
    with_tables = {heading: text for heading, text in found.items() if table_headers(text)}
    assert len(with_tables) >= 8
    for heading, text in with_tables.items():
        assert re.search(r"`rota (bench|sim) [a-z]", text) or "rota bench allocator" in text, heading
