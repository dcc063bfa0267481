"""The console's data layer: every page's data from SDK calls made with the caller's token.

One gRPC channel to the api is shared by every request; each request gets a `Client` over
it carrying that request's bearer token and the console's deadline, so the api (not the
console) decides what a tenant may see and do. Who a token belongs to is asked of the api
once a minute per token (`Gateway.viewer`).

Parts of a page that another service answers (the allocator's explanation, the checkpoint
images, the detector's verdicts) degrade to a note when that service is unreachable; the
page's main call (the job itself, the node list) fails the page with the api's status.
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc

from rota.client import Client, JobState, NotFoundError, RotaError
from rota.client.arrays import JobArray
from rota.console.grid import (
    NodeRow,
    PlanGrid,
    ProgressPanel,
    node_rows,
    plan_grid,
    progress_fraction,
    progress_panels,
)
from rota.console.params import JobFilters

T = TypeVar("T")

VIEWER_TTL_S = 60.0
LOG_TAIL_LINES = 200
ACTIONS = ("cancel", "pause", "resume")


@dataclass(frozen=True)
class Viewer:
    """Who a token is: the admin (sees and may act on every job) or one tenant."""

    admin: bool
    tenant: str = ""

    @property
    def name(self) -> str:
        return "admin" if self.admin else self.tenant


def allowed_actions(state: JobState) -> list[str]:
    """The buttons a job's page shows to whoever may see it (the api refuses the rest)."""
    if state.finished:
        return []
    actions = ["cancel"]
    if state == JobState.RUNNING:
        actions.append("pause")
    if state == JobState.PAUSED:
        actions.append("resume")
    return actions


@dataclass
class Part:
    """A page section another service answers: its value, or why there is none."""

    value: Any = None
    note: str = ""


def optional(call: Callable[[], T]) -> Part:
    try:
        return Part(call())
    except RotaError as exc:
        return Part(None, f"{exc.code}: {exc.message}")


@dataclass
class JobPage:
    job: Any
    explanation: Part
    verdicts: Part
    checkpoints: Part
    log_tail: Part
    fairness: Part
    actions: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float | None:
        return progress_fraction(self.job.progress)

    @property
    def panels(self) -> list[ProgressPanel]:
        return progress_panels(self.job.progress)


STATE_ORDER = ("RUNNING", "SCHEDULED", "PENDING", "PAUSED", "LOST", "SUCCEEDED", "FAILED", "CANCELLED")
MAX_ARRAY_TASKS_SHOWN = 100  # an array's page lists its first tasks, one GetJob each


@dataclass
class ArrayPage:
    """An array's page: the array, its explanation, and its first tasks grouped by state."""

    array: Any
    explanation: Part
    tasks: list[Any]

    @property
    def by_state(self) -> list[tuple[str, list[Any]]]:
        order = {s: i for i, s in enumerate(STATE_ORDER)}
        groups: dict[str, list[Any]] = {}
        for task in self.tasks:
            groups.setdefault(task.state, []).append(task)
        return sorted(groups.items(), key=lambda kv: order.get(kv[0], len(order)))

    @property
    def counts(self) -> list[tuple[str, int]]:
        order = {s: i for i, s in enumerate(STATE_ORDER)}
        return sorted(((s, n) for s, n in self.array.states.items() if n), key=lambda kv: order.get(kv[0], len(order)))

    @property
    def actions(self) -> list[str]:
        return ["cancel"] if not self.array.finished else []


class Gateway:
    def __init__(self, channel: grpc.Channel, deadline: timedelta) -> None:
        self._channel = channel
        self._deadline = deadline
        self._viewers: dict[str, tuple[float, Viewer]] = {}
        self._lock = threading.Lock()

    def client(self, token: str) -> Client:
        # Not closed after a request: the channel is the gateway's, shared by every request.
        return Client(self._channel, token=token, timeout=self._deadline)

    def viewer(self, token: str) -> Viewer:
        """The token's identity, from the api. UnauthenticatedError for a token it refuses.

        Asked once a VIEWER_TTL_S per token (WhoAmI), so a page costs no extra call."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            cached = self._viewers.get(key)
        if cached is not None and now - cached[0] < VIEWER_TTL_S:
            return cached[1]
        admin, tenant = self.client(token).whoami()  # UNAUTHENTICATED for an unknown or expired token
        viewer = Viewer(admin=admin, tenant=tenant)
        with self._lock:
            self._viewers = {k: v for k, v in self._viewers.items() if now - v[0] < VIEWER_TTL_S}
            self._viewers[key] = (now, viewer)
        return viewer

    # Pages.
    def cluster(self, token: str, viewer: Viewer) -> list[NodeRow]:
        client = self.client(token)
        nodes = [n.to_dict() for n in client.nodes()]
        own = None if viewer.admin else {j.id for j in client.list_jobs(states=[JobState.SCHEDULED, JobState.RUNNING])}
        bad = optional(client.devices)
        return node_rows(nodes, own, [(d.node, d.gpu) for d in bad.value or []])

    def jobs(self, token: str, filters: JobFilters) -> list[Any]:
        found = self.client(token).list_jobs(tenant=filters.tenant, states=list(filters.states), limit=filters.limit)
        return [j for j in found if not filters.kinds or j.kind in filters.kinds]

    def job(self, token: str, job_id: str, *, log_lines: int = LOG_TAIL_LINES) -> JobPage:
        client = self.client(token)
        job = client.get_job(job_id)  # NOT_FOUND (a 404) for an unknown job or another tenant's
        return JobPage(
            job=job,
            explanation=optional(lambda: client.explain(job_id)),
            verdicts=optional(lambda: client.verdicts(job_id=job_id, limit=50)),
            checkpoints=optional(lambda: client.checkpoints(job_id)),
            log_tail=optional(lambda: self._tail(client, job_id, log_lines)),
            fairness=optional(lambda: [f for f in client.job_fairness(tenant=job.tenant) if f.job_id == job_id]),
            actions=allowed_actions(job.state),
        )

    def job_or_array(self, token: str, job_id: str) -> JobPage | ArrayPage:
        """A job's page, or an array's for an array id; NOT_FOUND (a 404) for neither, or for
        another tenant's (the api answers both alike)."""
        try:
            return self.job(token, job_id)
        except NotFoundError:
            client = self.client(token)
            try:
                array = client.get_array(job_id)
            except NotFoundError:
                raise NotFoundError(f"job {job_id} not found (nor an array of that id)") from None
            tasks = [client.get_job(t) for t in array.job_ids[:MAX_ARRAY_TASKS_SHOWN]]
            return ArrayPage(array=array, explanation=optional(lambda: client.explain(job_id)), tasks=tasks)

    def job_state(self, token: str, job_id: str) -> dict[str, Any]:
        """What the job page refreshes: state, reason, progress, placement."""
        job = self.client(token).get_job(job_id)
        return {"id": job.id, "state": job.state, "reason": job.reason, "progress": job.progress,
                "node": job.node, "gpus": job.gpus, "finished": job.finished}

    def _tail(self, client: Client, job_id: str, lines: int) -> list[str]:
        # The whole log streams past; only its last lines are kept (deque), within the deadline.
        return list(collections.deque(client.logs(job_id, timeout=self._deadline), maxlen=lines))

    def plan(self, token: str, viewer: Viewer) -> PlanGrid | None:
        """The latest committed plan step as a grid; None before the first plan."""
        try:
            return plan_grid(self.client(token).current_plan().to_dict())
        except NotFoundError:
            return None

    def tenants(self, token: str, viewer: Viewer, days: int = 7) -> dict[str, Any]:
        client = self.client(token)
        since = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=days)
        tenants = client.list_tenants()
        standings = optional(client.standings)
        daily: dict[str, dict[str, float]] = {}
        for t in tenants:
            for row in client.usage(tenant=t.name, since=since, by="day"):
                daily.setdefault(t.name, {})[row.key] = row.weighted_gpu_hours
        day_keys = sorted({d for per in daily.values() for d in per})
        return {"tenants": tenants, "standings": standings, "daily": daily, "days": day_keys,
                "by_job": optional(lambda: client.usage(since=since, by="job"))}

    def standings(self, token: str) -> dict[str, Any]:
        return self.client(token).standings().to_dict()

    def health(self, token: str, viewer: Viewer) -> dict[str, Any]:
        client = self.client(token)
        return {"nodes": client.nodes(), "devices": optional(lambda: client.devices(include_cleared=True)),
                "verdicts": optional(lambda: client.verdicts(limit=100))}

    # Actions.
    def act(self, token: str, job_id: str, action: str) -> str:
        """Cancel, pause or resume with the caller's token; a line saying what happened.
        The api refuses what the token may not do (a RotaError with its message)."""
        client = self.client(token)
        if action == "cancel":
            found = client.cancel_job_or_array(job_id, reason="cancelled from the console")
            if isinstance(found, JobArray):
                return f"{job_id}: {len(found.job_ids)} unfinished tasks CANCELLED"
            return f"{job_id} is {found.state}"
        if action == "pause":
            paused = client.pause(job_id)
            return f"{job_id} paused at step {paused.step} (image {paused.image_id})"
        if action == "resume":
            client.resume(job_id)
            return f"{job_id} resumed: back in the queue"
        raise ValueError(f"action: one of {', '.join(ACTIONS)}")
