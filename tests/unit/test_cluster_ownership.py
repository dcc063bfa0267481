"""rota.cluster is the only writer of the cluster tables (docs/architecture.md, "Who owns which
table"): no source file outside services/rota/cluster holds SQL that inserts, updates or
deletes them, builds such a statement on their models, or imports their models at all
(import-linter checks the packages' imports; this scan covers every source file, scripts
and migrations' neighbours included). The scanner is tried on snippets first, so a scan
that finds nothing has shown it can find something."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("services", "clients", "bench", "core")
OWNER = REPO / "services" / "rota" / "cluster"
TABLES = ("jobs", "job_transitions", "job_arrays", "gang_exits", "placements", "gpu_claims", "gpu_guests",
          "nodes", "gpus")
MODELS = ("JobRow", "JobTransitionRow", "JobArrayRow", "GangExitRow", "PlacementRow", "GpuClaimRow", "GpuGuestRow",
          "NodeRow", "GpuRow")

_table = "|".join(TABLES)
_model = "|".join(MODELS)
_alias = "|".join(("Job", "JobArray", "Transition", "Node", "Gpu", "Claim"))
RULES = {
    "SQL writing a cluster table": re.compile(
        rf"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+(?:{_table})\b", re.IGNORECASE),
    # On a model, or on the names rota.cluster.queries gives the rows' types for annotations.
    "a statement built on a cluster model": re.compile(
        rf"\b(?:insert|update|delete)\(\s*(?:(?:{_model})|queries\.(?:{_alias}))\b"),
    "a cluster row constructed": re.compile(rf"\bqueries\.(?:{_alias})\("),
    "an import of the cluster models": re.compile(
        r"^\s*(?:from\s+rota\.cluster\.models\s+import|import\s+rota\.cluster\.models\b"
        r"|from\s+rota\.cluster\s+import\s+[^\n]*\bmodels\b)"),
}


def findings(text: str) -> list[str]:
    """The rules `text` breaks, each with the line that breaks it."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith(("\"", "'")) else line
        for rule, pattern in RULES.items():
            if pattern.search(code):
                found.append(f"{number}: {rule}: {line.strip()}")
    return found


@pytest.mark.parametrize("snippet", [
    'session.execute(text("UPDATE jobs SET state = :s WHERE id = :id"))',
    "INSERT INTO gpu_claims (node, gpu_index, job_id) VALUES (%s, %s, %s)",
    'conn.execute("delete from placements where job_id = %s", (job_id,))',
    "TRUNCATE nodes",
    "session.execute(update(JobRow).where(JobRow.id == job_id).values(state='FAILED'))",
    "session.execute(delete(GpuClaimRow).where(GpuClaimRow.job_id == job_id))",
    "session.execute(update(queries.Job).values(state='FAILED'))",
    "session.add(queries.Node(name='n', address='a', health='ALIVE'))",
    "from rota.cluster.models import JobRow",
    "from rota.cluster import models",
])
def test_the_scanner_finds_a_write_of_the_cluster_tables(snippet: str) -> None:
    assert findings(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "SELECT id, state FROM jobs WHERE tenant = %s",  # reading is not writing
    "INSERT INTO ledger_usage (job_id, tenant) VALUES (%s, %s)",  # another owner's table
    "UPDATE jobs_archive SET x = 1",  # another table whose name begins alike
    "session.execute(update(UsageRow).values(closed=True))",
    "from rota.cluster import job_lifecycle, queries",
    "def cancel(job: queries.Job) -> None:",
    "rows.append(NodeRow(name, health))  # the console's own NodeRow, a view row",
])
def test_the_scanner_leaves_reads_and_other_tables_alone(snippet: str) -> None:
    assert findings(snippet) == [], snippet


def test_no_module_outside_rota_cluster_writes_the_cluster_tables() -> None:
    broken: list[str] = []
    scanned = 0
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if OWNER in path.parents or "_pb2" in path.name:
                continue
            scanned += 1
            broken += [f"{path.relative_to(REPO)}:{finding}" for finding in findings(path.read_text())]
    assert scanned > 100  # the roots were found
    assert broken == [], "\n".join(broken)


def test_rota_cluster_is_where_they_are_written() -> None:
    """The owner's own files do break the rules: the scan reaches what it guards."""
    owned = [finding for path in OWNER.rglob("*.py") for finding in findings(path.read_text())]
    assert any("SQL writing a cluster table" in f for f in owned)
    assert any("an import of the cluster models" in f for f in owned)
