"""Rows and reports the detector's integration tests share: tenants, nodes and placed jobs
on the real database, and a fail-slow workload's ReportIteration requests."""

from __future__ import annotations

import secrets
from typing import Any

from rota.api import repository as api
from rota.bench.detector_workload import Generator, parse_config
from rota.cluster import job_starts, node_lifecycle, submissions
from rota.cluster.job_lifecycle import Events
from rota.cluster.models import GpuRow
from rota.common.auth import hash_token
from rota.common.db import Database
from rota.core.detection.layout import flatten
from rota.core.jobspec import JobSpecData, validate
from rota.core.planning.liveplan import Start
from rota.v1 import detector_pb2


def tenant(db: Database) -> tuple[str, str]:
    """A tenant of its own: (name, token)."""
    name, token = "t-" + secrets.token_hex(4), "tok-" + secrets.token_hex(12)
    db.run(lambda s: api.create_tenant(s, name, 1.0, hash_token(token)))
    return name, token


def node_with(db: Database, gpus: int) -> str:
    """A fresh node of `gpus` virtual GPUs."""
    node = "n-" + secrets.token_hex(4)
    rows = [GpuRow(node=node, index=i, uuid=f"{node}-{i}", model="virtual", virtual=True) for i in range(gpus)]
    db.run(lambda s: node_lifecycle.register(s, node, "127.0.0.1:1", rows))
    return node


def running_job(db: Database, owner: str, gpus: int = 4, **spec: Any) -> tuple[str, str, int]:
    """A job placed on a fresh node: (job id, node, epoch)."""
    node = node_with(db, gpus)
    data = JobSpecData(name="pp", tenant=owner, kind="training", priority=5, gpus=gpus, command=["true"])
    for k, v in spec.items():
        setattr(data, k, v)
    job, _ = db.run(lambda s: submissions.submit_job(s, validate(data, max_gpus_per_node=0), "", Events()))
    placed = db.run(lambda s: job_starts.commit_decision(s, Start(job.id, node, tuple(range(gpus))), Events()))
    assert placed is not None
    return job.id, node, placed.epoch


def report_requests(job_id: str, epoch: int, faults: list[dict[str, Any]],
                    iterations: int) -> list[detector_pb2.ReportIterationRequest]:
    """A 2x2x1 job's noisy reports (seed 3) with the given faults, as ReportIteration requests."""
    cfg = parse_config({
        "seed": 3, "iterations": iterations, "layout": {"tp": 2, "pp": 2, "dp": 1}, "microbatches": 4,
        "seq_len": {"median": 2048, "sigma": 1.0, "max": 32768}, "tokens_per_microbatch": 16384, "noise": 0.03,
        "faults": faults, "hiccup_rate": 0.0,
    })
    out = []
    for step in Generator(cfg, seed=3):
        r = step.report
        lengths, counts, _ = flatten(r.micro_batches)
        out.append(detector_pb2.ReportIterationRequest(
            job_id=job_id, epoch=epoch, iteration=r.iteration, rank_seconds=[-1.0 if s is None else s for s in r.rank_seconds],
            sequence_lengths=lengths, sequences_per_micro_batch=counts, iteration_seconds=r.iteration_seconds,
            layout=detector_pb2.Layout(tp=2, pp=2, dp=1),
        ))
    return out
