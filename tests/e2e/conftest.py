from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cluster import RunningCluster, own_cluster  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "cluster")
