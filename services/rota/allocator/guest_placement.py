"""The scheduling cycle's part for guests in pipeline bubbles (rota.core.planning.guests).

Each cycle, before it plans, guests whose host ended take the host's GPUs over; after the
plan's commits, the trials it left waiting go into running pipelines' bubbles, and between
plans the same trials go into bubbles that opened since (a host's first bubble report
changes nothing the plan looks at, so it would not re-plan for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rota.cluster import guest_leases, job_protos
from rota.cluster.job_lifecycle import Events
from rota.common import metrics, read_models
from rota.common.db import Database
from rota.core.planning.guests import GuestCandidate, place_guests
from rota.core.planning.liveplan import LiveJob
from rota.v1 import agent_pb2

Launch = tuple[str, agent_pb2.LaunchRequest]  # an agent's address, what it is to launch


@dataclass
class GuestPlacement:
    db: Database
    waiting: list[LiveJob] = field(default_factory=list)  # trials the last plan left waiting

    def take_over(self, events: Events) -> int:
        """Guests whose host no longer holds their GPUs take them over; how many did."""
        def run(session: Session) -> int:
            return sum(guest_leases.take_over(session, job_id, events) for job_id in guest_leases.orphaned_guests(session))
        taken = self.db.run(run)
        if taken:
            metrics.BUBBLE_TAKEOVERS.inc(taken)
        return taken

    def after_plan(self, jobs: list[LiveJob], started: set[str], held_back: dict[str, str],
                   events: Events) -> list[Launch]:
        """The trials the plan neither started nor held back, placed as guests where there are
        bubbles; the rest are remembered for the cycles until the next plan."""
        trials = [j for j in jobs if j.kind == "trial" and j.node is None and not j.nodes
                  and j.id not in started and j.id not in held_back]
        launches = self.db.run(lambda s: _commit_guests(s, trials, events))
        placed = {r.job.id for _, r in launches}
        self.waiting = [j for j in trials if j.id not in placed]
        return launches

    def between_plans(self, events: Events) -> list[Launch]:
        """The remembered trials, placed into bubbles that opened since the last plan."""
        if not self.waiting:
            return []
        launches = self.db.run(lambda s: _commit_guests(s, self.waiting, events))
        placed = {r.job.id for _, r in launches}
        self.waiting = [j for j in self.waiting if j.id not in placed]
        return launches


def _commit_guests(session: Session, trials: list[LiveJob], events: Events) -> list[Launch]:
    """Each guest in its own savepoint: a host that moved on meanwhile skips that one trial."""
    if not trials:
        return []
    hosts = guest_leases.bubble_hosts(session)
    addresses = guest_leases.live_addresses(session, {h.node for h in hosts})
    hosts = [h for h in hosts if h.node in addresses]
    starts = place_guests(hosts, [GuestCandidate(j.id, j.gpus, j.priority, j.gpu_types, j.gpu_memory_mb)
                                  for j in trials])
    launches: list[Launch] = []
    for start in starts:
        try:
            with session.begin_nested():
                job = guest_leases.commit_guest(session, start, events)
        except IntegrityError:  # the GPU took a guest meanwhile: its key refused a second
            continue
        if job is None:
            continue
        metrics.BUBBLE_GUESTS.inc()
        message = job_protos.job_on_node(job, start.node)
        launches.append((addresses[start.node], agent_pb2.LaunchRequest(
            job=message, epoch=message.epoch, **read_models.launch_fields(session, job.id))))
    return launches
