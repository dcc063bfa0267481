"""The SDK's names for a job's state and kind: string enums, so a value compares equal to
the text the CLI prints and `--json` writes (`JobState.RUNNING == "RUNNING"`,
`JobKind.BATCH_INFERENCE == "batch_inference"`).

The wire's enums (rota.v1.common_pb2.JobState, JobKind) are converted in
`rota.client._wire`; no proto type appears in the SDK's public signatures."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["JobKind", "JobState"]


class JobState(StrEnum):
    """PENDING -> SCHEDULED -> RUNNING -> SUCCEEDED | FAILED | CANCELLED, plus PAUSED
    (checkpointed, holding no GPU) and LOST (its node died; requeued or failed)."""

    # In the order of a job's life (iteration lists them so): waiting, active, ended, lost.
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"

    @property
    def finished(self) -> bool:
        """SUCCEEDED, FAILED or CANCELLED: the job will not run again."""
        return self in FINISHED

    @classmethod
    def parse(cls, text: str) -> JobState:
        """A state from its name in any case ("running"); ValueError listing the names."""
        try:
            return cls(text.strip().upper())
        except ValueError:
            raise ValueError(f"unknown job state {text!r}; one of {', '.join(s.value for s in cls)}") from None


FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
HOLDING = frozenset({JobState.SCHEDULED, JobState.RUNNING})  # holds GPUs


class JobKind(StrEnum):
    """What a job is, as a job file's `kind` names it."""

    TRAINING = "training"
    BATCH_INFERENCE = "batch_inference"
    QUANTIZATION = "quantization"
    REALTIME = "realtime"
    TRIAL = "trial"
