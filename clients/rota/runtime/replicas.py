"""What a realtime app serves on now: the allocator scales it by rewriting this file.

The agent writes `ROTA_REPLICAS_FILE` atomically at launch and at every resize (each under
a newer epoch): `replicas()` is this node's replica set. The agent runs an app as one
process per replica, on its own GPU (`replica()`: ROTA_REPLICA_GPU, ROTA_REPLICA_INDEX),
starting and stopping processes as the set changes; a script run outside Rota, or by an
older agent, gets None there and may serve every GPU of `replicas()` itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

ENV_REPLICAS_FILE = "ROTA_REPLICAS_FILE"
ENV_REPLICA_GPU = "ROTA_REPLICA_GPU"
ENV_REPLICA_INDEX = "ROTA_REPLICA_INDEX"


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


@dataclass(frozen=True)
class Replica:
    gpu: int  # the node's GPU index this process serves on (CUDA_VISIBLE_DEVICES is that GPU alone)
    index: int  # the lowest index no other replica on this node has


def replica() -> Replica | None:
    """This process's replica when the agent runs one process per replica, else None."""
    gpu = os.environ.get(ENV_REPLICA_GPU)
    if gpu is None or not gpu.isdigit():
        return None
    index = os.environ.get(ENV_REPLICA_INDEX, "0")
    return Replica(int(gpu), int(index) if index.isdigit() else 0)
