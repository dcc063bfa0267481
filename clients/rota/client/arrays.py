"""Job arrays in the SDK: the index set as the wire's text, and the array the api answers.

`Client.submit_array(spec=..., indices=range(100), max_running=4)` makes one job per index
in one call and one commit; each task is a job `<array id>_<index>` whose process reads
ROTA_ARRAY_ID and ROTA_ARRAY_INDEX (and Slurm's SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID).
The server parses and checks the indices (INVALID_ARGUMENT naming `array`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rota.client import _wire
from rota.client.enums import FINISHED, JobState
from rota.client.jobspec import JobSpec
from rota.v1 import api_pb2


def indices_text(indices: range | Sequence[int] | str) -> str:
    """`range(0, 100)` -> "0-99", `range(0, 100, 5)` -> "0-95:5", `[1, 3, 5]` -> "1,3,5";
    text ("0-99%4", "1,3,5-9") as it is."""
    if isinstance(indices, str):
        return indices
    if isinstance(indices, range):
        if len(indices) == 0 or indices.step < 1:
            return ""  # refused by the server, naming the field
        step = f":{indices.step}" if indices.step != 1 else ""
        return f"{indices.start}-{indices[-1]}{step}"
    return ",".join(str(int(i)) for i in indices)


def array_request(
    spec: JobSpec, indices: range | Sequence[int] | str, max_running: int | None,
    request_id: str | None,
) -> api_pb2.SubmitJobArrayRequest:
    return api_pb2.SubmitJobArrayRequest(
        spec=_wire.spec_to_proto(spec), indices=indices_text(indices), max_running=max_running or 0,
        request_id=request_id or str(uuid.uuid4()))


@dataclass(frozen=True)
class JobArray:
    """An array: its tasks' ids in index order (after a submit or a cancel) and how many
    tasks are in each state (after a listing or a cancel)."""

    id: str
    tenant: str
    name: str
    count: int
    max_running: int  # 0: no cap
    job_ids: list[str] = field(default_factory=list)
    states: dict[JobState, int] = field(default_factory=dict)
    created_at: datetime | None = None

    @staticmethod
    def _from_proto(message: api_pb2.JobArray) -> JobArray:
        created = message.created_at
        return JobArray(
            id=message.id, tenant=message.tenant, name=message.name, count=message.count,
            max_running=message.max_running, job_ids=list(message.job_ids),
            states={_wire.job_state(s.state): s.count for s in message.states},
            created_at=created.ToDatetime(tzinfo=UTC) if created.seconds or created.nanos else None,
        )

    @property
    def finished(self) -> bool:
        """Every task has ended (known once `states` counts them all)."""
        return sum(n for s, n in self.states.items() if s in FINISHED) == self.count

    def to_dict(self) -> dict[str, Any]:
        return {"array": self.id, "jobs": list(self.job_ids), "count": self.count, "tenant": self.tenant,
                "name": self.name, "max_running": self.max_running, "states": dict(self.states)}


__all__ = ["JobArray", "array_request", "indices_text"]
