"""The local control channel between a node agent and the ranks of its job: small files.

Files in the folder named by ``ROTA_CONTROL_DIR`` (one folder per launch):

    rank-<r>.json           a rank's registration: {"rank", "world_size", "pid"}
    request.json            the agent's current request: {"seq", "kind", "deadline", "staging"}
    ack-<seq>-<r>.json      rank r's answer: {"ok", "step", "bytes", "copy_s", "error"}
    decision-<seq>          "commit" or "abort" (pause only): the second phase
    vote-<seq>              "abort": the ranks' joint vote overruled this node's commit
                            (a gang: another node's ranks did not all copy their state)

Why files: a rank checks for a request once per iteration, and a ``stat`` costs a few
microseconds; there is no socket to serve, no thread in the job, and a rank that never
reaches a safe point simply never answers, which the agent's bounded wait turns into a
clear failure. Every file is written to a temporary name and renamed, so a reader sees
all of it or nothing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The restore folder's markers and the atomic write belong to the image format; the agent and the
# runtime read them here beside the control files.
from rota.imageformat.files import FAILED as FAILED
from rota.imageformat.files import READY as READY
from rota.imageformat.files import write_atomic

ENV_CONTROL_DIR = "ROTA_CONTROL_DIR"
ENV_RESTORE_DIR = "ROTA_RESTORE_DIR"
REQUEST = "request.json"
COMMIT = "commit"
ABORT = "abort"
CHECKPOINT = "checkpoint"
PAUSE = "pause"


@dataclass(frozen=True)
class Request:
    seq: int
    kind: str  # checkpoint | pause
    deadline: float  # unix seconds: past it, the request is void
    staging: str

    def to_json(self) -> str:
        return json.dumps({"seq": self.seq, "kind": self.kind, "deadline": self.deadline, "staging": self.staging})

    @staticmethod
    def from_json(text: str) -> Request:
        d = json.loads(text)
        return Request(int(d["seq"]), str(d["kind"]), float(d["deadline"]), str(d["staging"]))


def registration_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.json"


def ack_path(folder: Path, seq: int, rank: int) -> Path:
    return folder / f"ack-{seq}-{rank}.json"


def decision_path(folder: Path, seq: int) -> Path:
    return folder / f"decision-{seq}"


def register(folder: Path, rank: int, world_size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(registration_path(folder, rank), json.dumps({"rank": rank, "world_size": world_size, "pid": os.getpid()}))


def registrations(folder: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in folder.glob("rank-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(data["rank"])] = data
    return out


def write_request(folder: Path, request: Request) -> None:
    write_atomic(folder / REQUEST, request.to_json())


def read_request(folder: Path) -> Request | None:
    try:
        return Request.from_json((folder / REQUEST).read_text())
    except FileNotFoundError:
        return None


def write_ack(folder: Path, seq: int, rank: int, **answer: Any) -> None:
    write_atomic(ack_path(folder, seq, rank), json.dumps(answer))


def read_acks(folder: Path, seq: int) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in folder.glob(f"ack-{seq}-*.json"):
        rank = int(path.stem.rsplit("-", 1)[1])
        try:
            out[rank] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out


def write_decision(folder: Path, seq: int, decision: str) -> None:
    write_atomic(decision_path(folder, seq), decision)


def vote_path(folder: Path, seq: int) -> Path:
    return folder / f"vote-{seq}"


def write_vote(folder: Path, seq: int, decision: str) -> None:
    write_atomic(vote_path(folder, seq), decision)


def read_vote(folder: Path, seq: int) -> str:
    """The ranks' joint decision on request `seq` where it overruled the agent's; "" if none."""
    try:
        return vote_path(folder, seq).read_text().strip()
    except FileNotFoundError:
        return ""


def wait_decision(folder: Path, seq: int, until: float, poll_s: float = 0.001) -> str:
    """The agent's decision on request `seq`; ABORT when none came by `until` (unix time)."""
    path = decision_path(folder, seq)
    while True:
        try:
            return path.read_text().strip() or ABORT
        except FileNotFoundError:
            pass
        if time.time() >= until:
            return ABORT
        time.sleep(poll_s)
