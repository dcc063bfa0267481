"""What a job imports: progress reports, the job's context, and checkpointing.

A job reports with ``rota.runtime.report(step=100, loss=2.31)`` and picks its device with
``rota.runtime.job_context().device()``; a realtime app reads its replica set, which
the allocator scales, with ``rota.runtime.replicas()`` (one process per replica:
``rota.runtime.replica()`` is this process's); a job that can be paused, resumed
and migrated registers its state with ``rota.runtime.Checkpointer(model=..., ...)`` and
calls its ``safe_point(step)`` once per iteration; a pipeline-parallel job reports its
iterations to the failure detector with ``rota.runtime.report_iteration(...)``, and, when
it accepts layout changes, reads a re-planned layout with ``rota.runtime.layout()``; a
pipeline job that reports ``step_s`` and ``bubble_s`` hosts trials in its bubbles and
reads them with ``rota.runtime.bubble_guests()``.
"""

from rota.runtime.guests import bubble_guests, guest_of
from rota.runtime.iterations import heartbeat, report_iteration
from rota.runtime.progress import JobContext, job_context, report
from rota.runtime.replanned import layout
from rota.runtime.replicas import Replica, Replicas, replica, replicas
from rota.runtime.state import Checkpointer, Paused

__all__ = ["Checkpointer", "JobContext", "Paused", "Replica", "Replicas", "bubble_guests", "guest_of", "job_context",
           "replica", "replicas", "report", "heartbeat", "layout", "report_iteration"]
