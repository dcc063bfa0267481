"""Every reference the repository makes to its design stays inside it: no `../shared/SPEC.md`
or `REFERENCES.md`, and each `docs/design.md §N` cited names a section docs/design.md has.
The traces under `../shared/data/traces/` are data the benchmarks read at run time, not a
document, and may stay."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = (".py", ".md", ".toml", ".yaml", ".yml", ".json", ".cfg", ".ini", ".txt", ".proto", ".sh", ".html")


def tracked_text() -> dict[str, str]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return {n: (ROOT / n).read_text(encoding="utf-8", errors="replace") for n in listed
            if n.endswith(TEXT) and (ROOT / n).is_file() and n != "tests/unit/test_docs_references.py"}


def test_no_reference_points_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared/(?!data/traces)|SPEC\.md|REFERENCES\.md|\bSPEC ?§")
    found = [f"{name}:{i}: {line.strip()}" for name, text in tracked_text().items()
             for i, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert not found, "\n".join(found)


def test_every_cited_design_section_exists() -> None:
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\. ", design, flags=re.M))
    cited = {(name, n) for name, text in tracked_text().items()
             for ref in re.findall(r"design\.md (§\d+(?:, §\d+)*)", text) for n in re.findall(r"\d+", ref)}
    assert cited, "no citation found: the pattern no longer matches the code's citations"
    missing = sorted(f"{name}: §{n}" for name, n in cited if n not in sections)
    assert not missing, missing
