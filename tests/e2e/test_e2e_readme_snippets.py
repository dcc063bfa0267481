"""The README's SDK snippet runs as printed: its python code, in a fresh interpreter, against
a real cluster `rota up --home DIR` started, with only ROTA_HOME set (no tenant made yet)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import REPO, RunningCluster, start_cluster

pytestmark = pytest.mark.e2e

SECTION = "### The SDK"


def section_code(heading: str) -> list[str]:
    """The ```python blocks of one README section: from its heading to the next heading of
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
                fence, in_code = ([] if line.strip() == "```python" else None), True
        elif in_code:
            if fence is not None:
                fence.append(line)
        elif line.startswith("#"):
            break
    return blocks


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    """A cluster as a reader's `rota up` leaves it: no tenant yet (the snippet makes `demo`)."""
    url = databases.create()
    running = start_cluster(tmp_path_factory.mktemp("readme") / "home", url, redis_url, nodes=1)
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
