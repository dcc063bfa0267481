"""What a job imports: progress reports and the job's context.

A job reports with ``rota.runtime.report(step=100, loss=2.31)`` and picks its device with
``rota.runtime.job_context().device()``; a realtime app reads its replica set, which
the allocator scales, with ``rota.runtime.replicas()``.
"""

from rota.runtime.progress import JobContext, job_context, report
from rota.runtime.replicas import Replicas, replicas

__all__ = ["JobContext", "Replicas", "job_context", "replicas", "report"]
