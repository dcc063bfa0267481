"""What a realtime app serves on now: the allocator scales it by rewriting this file.

The agent writes `ROTA_REPLICAS_FILE` atomically at launch and at every resize (each under
a newer epoch), so an app polls `replicas()` and runs one replica per GPU listed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

ENV_REPLICAS_FILE = "ROTA_REPLICAS_FILE"


@dataclass(frozen=True)
class Replicas:
    epoch: int
    gpus: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.gpus)


def replicas() -> Replicas | None:
    """The current replica set, or None outside Rota (no file named in the environment)."""
    path = os.environ.get(ENV_REPLICAS_FILE)
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        data = json.load(f)
    return Replicas(int(data["epoch"]), tuple(int(g) for g in data["gpus"]))
