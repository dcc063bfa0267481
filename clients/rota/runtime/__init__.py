"""What a job imports: progress reports and the job's context.

A job reports with ``rota.runtime.report(step=100, loss=2.31)`` and picks its device with
``rota.runtime.job_context().device()``.
"""

from rota.runtime.progress import JobContext, job_context, report

__all__ = ["JobContext", "job_context", "report"]
