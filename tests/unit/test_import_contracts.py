"""docs/architecture.md's package table and pyproject.toml's import contracts say the same.

Each row of the table (one package, or the services together) has one `forbidden` contract
whose source_modules are the row's packages. The row's "may import" column (the `rota.*`
names before its first ";") is exactly what the contracts leave allowed: every other root
package is forbidden to the row, by its own contract, by another contract over the same
sources, or (services) by the independence contract. Rows of sub-packages ("as `rota.core`")
share their parent's contract; `rota.bench` may import anything.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"`(rota\.[a-z0-9_.]+)`")


def contracts() -> tuple[list[str], list[dict[str, object]]]:
    linter = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    return list(linter["root_packages"]), list(linter["contracts"])


def rows() -> list[tuple[list[str], str]]:
    """(the row's packages, its "may import" cell) for each row of the package table."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Processes and packages", 1)[1].split("###", 1)[0]
    found = []
    for line in section.splitlines():
        if not line.startswith("| `rota."):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, line
        found.append((NAME.findall(cells[0]), cells[4]))
    assert found, "no package table in docs/architecture.md"
    return found


def root_of(name: str, roots: list[str]) -> str | None:
    return next((r for r in roots if name == r or name.startswith(r + ".")), None)


def test_every_root_package_has_a_row() -> None:
    roots, _ = contracts()
    listed = {p for packages, _ in rows() for p in packages}
    assert set(roots) <= listed, f"root packages without a row in docs/architecture.md: {set(roots) - listed}"
    assert {p for p in listed if p.count(".") == 1} <= set(roots), "a row names a package import-linter does not know"


def test_each_row_has_its_contract_and_may_import_what_the_contracts_allow() -> None:
    roots, all_contracts = contracts()
    forbidden = [c for c in all_contracts if c["type"] == "forbidden"]
    independence = [c for c in all_contracts if c["type"] == "independence"]
    checked = 0
    for packages, may in rows():
        if may.startswith("as `") or may.startswith("anything"):
            continue  # a sub-package under its parent's contract; the benchmarks
        own = [c for c in forbidden if set(c["source_modules"]) == set(packages)]  # type: ignore[arg-type]
        assert len(own) == 1, f"{packages}: {len(own)} contracts with exactly these source_modules"
        allowed = {root_of(n, roots) for n in NAME.findall(may.split(";", 1)[0])} - {None}
        expected = set(roots) - allowed - set(packages)
        actual: set[str] = set()
        for contract in forbidden:
            if set(packages) <= set(contract["source_modules"]):  # type: ignore[arg-type]
                actual |= {m for m in contract["forbidden_modules"] if m in roots}  # type: ignore[union-attr]
        for contract in independence:
            if set(packages) <= set(contract["modules"]):  # type: ignore[arg-type]
                actual |= set(contract["modules"]) - set(packages)  # type: ignore[arg-type]
        assert actual == expected, (f"{packages}: the table allows {sorted(allowed)}; contracts forbid "
                                    f"{sorted(actual - expected)} it allows, and allow {sorted(expected - actual)} it forbids")
        checked += 1
    assert checked >= 12
