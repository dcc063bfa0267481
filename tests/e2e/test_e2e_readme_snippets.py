"""The README's SDK snippet runs as printed: its python code, in a fresh interpreter, against
a real cluster `rota up --home DIR` started, with only ROTA_HOME set (no tenant made yet).
So do the tour's lines a newcomer tripped on: a tenant's token exported from `rota tenants
add`, the example files submitted with it (no --tenant), `rota replan ID --apply` on the
tour's own pipeline job, and the admin's `rota drain` and `rota health --clear`."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import REPO, RunningCluster, start_cluster, wait_until

pytestmark = pytest.mark.e2e

SECTION = "### The SDK"
TOUR = "## A five-minute tour"


def section_code(heading: str, language: str = "python") -> list[str]:
    """The ```LANGUAGE blocks of one README section: from its heading to the next heading of
    any level outside a code block (a `# comment` inside one is no heading)."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(heading) + 1
    blocks: list[str] = []
    fence: list[str] | None = None  # the lines of the python block being read
    in_code = False
    for line in lines[start:]:
        if line.startswith("```"):
            if in_code:
                if fence is not None:
                    blocks.append("\n".join(fence) + "\n")
                fence, in_code = None, False
            else:
                fence, in_code = ([] if line.strip() == "```" + language else None), True
        elif in_code:
            if fence is not None:
                fence.append(line)
        elif line.startswith("#"):
            break
    return blocks


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    """A cluster as a reader's `rota up` leaves it: no tenant yet (the snippet makes `demo`);
    two nodes, as the tour drains node-2."""
    url = databases.create()
    running = start_cluster(tmp_path_factory.mktemp("readme") / "home", url, redis_url, nodes=2)
    try:
        yield running
    finally:
        running.stop()
        databases.drop(url)


def test_the_sdk_section_has_a_python_snippet() -> None:
    blocks = section_code(SECTION)
    assert blocks, f"no ```python block under {SECTION!r} in README.md"
    assert all("Client." in b for b in blocks)


def test_the_sdk_snippet_runs_as_printed_with_rota_home(cluster: RunningCluster) -> None:
    env = cluster.env()
    assert env["ROTA_HOME"] == str(cluster.home) and "ROTA_ENDPOINT" not in env and "ROTA_TOKEN" not in env
    blocks = section_code(SECTION)
    assert blocks
    for code in blocks:
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=240)
        assert result.returncode == 0, f"README snippet failed:\n{result.stdout}\n{result.stderr}"
        out = result.stdout.splitlines()
        assert out and out[0].startswith("SUCCEEDED {"), result.stdout  # print(done.state, done.progress)
        assert any(line.startswith("done: 300 steps") for line in out), result.stdout  # a line of client.logs()
        assert out[-1] == "SUCCEEDED ['hello']", result.stdout  # as the snippet's comment says


def tour_lines() -> list[str]:
    """The tour's command lines, without their comments."""
    return [line.split("  #", 1)[0].strip() for block in section_code(TOUR, "bash") for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def tour_line(start: str) -> str:
    found = [line for line in tour_lines() if line.startswith(start)]
    assert found, f"no line starting {start!r} in the README's tour"
    return found[0]


def test_the_tours_tenant_token_replan_and_admin_lines_run_as_printed(cluster: RunningCluster) -> None:
    def sh(line: str, token: str = "") -> subprocess.CompletedProcess[str]:
        env = {**cluster.env(), **({"ROTA_TOKEN": token} if token else {})}
        return subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    # The tenant's token, as the tour exports it (a tenant of this test's own: the SDK snippet makes demo).
    made = sh(tour_line("export ROTA_TOKEN=").replace(" demo ", " tour ") + ' && printf %s "$ROTA_TOKEN"')
    token = made.stdout
    assert made.returncode == 0 and token.startswith("rt_"), (made.stdout, made.stderr)
    # The pipeline example names no tenant: the token's is taken, no --tenant needed.
    submitted = sh(tour_line("rota submit examples/pipeline.yaml"), token)
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"submitted (j-\w+)", submitted.stdout)
    assert job_id, submitted.stdout
    job = cluster.wait_job(job_id[1], ("RUNNING",), timeout_s=60)
    assert job.tenant == "tour"
    # The admin token acts for no tenant: the same file is refused in one line naming the field.
    refused = sh("rota submit examples/pipeline.yaml")
    assert refused.returncode == 1 and refused.stderr.splitlines() == [refused.stderr.strip()]
    assert refused.stderr.startswith("rota: INVALID_ARGUMENT: tenant: required with the admin token"), refused.stderr
    # `rota replan <PIPELINE_ID> --apply` on the tour's own job, once it is flagged slow.
    wait_until(lambda: [v for v in cluster.cli_json("health", "--job", job.id)["verdicts"] if v["kind"] == "slow"],
               90, "a slow verdict on the tour's pipeline job")
    replanned = sh(tour_line("rota replan ").replace("<PIPELINE_ID>", job.id), token)
    assert replanned.returncode == 0 and "applied: checkpointed at step" in replanned.stdout, replanned.stderr
    # The admin's lines, after the tour's `unset ROTA_TOKEN`.
    lines = tour_lines()
    admin_lines = [tour_line("rota drain "), tour_line("rota health --clear ")]
    assert all(lines.index("unset ROTA_TOKEN") < lines.index(line) for line in admin_lines)
    for line in admin_lines:
        done = sh(line)
        assert done.returncode == 0, f"{line}: {done.stderr}"
    cluster.cli("drain", "node-2", "--undo")
    cluster.cli("cancel", job.id)
