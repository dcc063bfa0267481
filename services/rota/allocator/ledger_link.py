"""The allocator's read of the ledger: the standings the `fair` policy plans on, by RPC.

The ledger owns usage and standings (it replays the window over its own tables); the
allocator asks its Standings (stage 1, tenants) and FairnessIndex (stage 2, jobs) once per
`fair` re-plan, before the cycle opens any transaction, and adds the GPUs each tenant holds
now, which its own snapshot already knows. Without an answer the re-plan goes on without
standings (the fair order then falls back to the plain one) and says so in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import grpc

from rota.common.tls import TLSFiles, open_aio_channel
from rota.core import jobstate
from rota.core.fairness.ltgf import FairnessConfig
from rota.core.fairness.twostage import JobView, TenantState
from rota.core.planning.planner import FairInputs
from rota.v1 import common_pb2, ledger_pb2, ledger_pb2_grpc

log = logging.getLogger(__name__)
HOUR_S = 3600.0  # the ledger answers in GPU-hours; the fairness core counts GPU-seconds
STANDINGS_DEADLINE_S = 5.0


class LedgerStandings:
    def __init__(self, address: str | None, admin_token: str, *, tls: TLSFiles | None = None) -> None:
        self._address, self._tls = address, tls
        self._stub: ledger_pb2_grpc.LedgerServiceStub | None = None
        self._metadata = (("authorization", f"Bearer {admin_token}"),)

    async def fair_inputs(self, config: FairnessConfig, held: Mapping[str, int]) -> FairInputs | None:
        """Both stages' inputs, or None when no ledger is configured or it does not answer."""
        if not self._address:
            return None
        if self._stub is None:  # an aio channel belongs to the event loop it is opened on: open it on the loop's
            self._stub = ledger_pb2_grpc.LedgerServiceStub(open_aio_channel(self._address, self._tls))
        stub = self._stub
        try:
            # The generated stubs type calls as synchronous; grpc.aio returns awaitables.
            tenants, jobs = await asyncio.gather(  # type: ignore[call-overload]
                stub.Standings(ledger_pb2.StandingsRequest(), timeout=STANDINGS_DEADLINE_S,
                                     metadata=self._metadata),
                stub.FairnessIndex(ledger_pb2.FairnessIndexRequest(), timeout=STANDINGS_DEADLINE_S,
                                         metadata=self._metadata),
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("fair re-plan without standings: the ledger answered %s: %s", exc.code().name, exc.details())
            return None
        return fair_inputs_from(tenants, jobs, config, held)


def fair_inputs_from(
    tenants: ledger_pb2.StandingsResponse, jobs: ledger_pb2.FairnessIndexResponse, config: FairnessConfig,
    held: Mapping[str, int],
) -> FairInputs:
    """The ledger's answers as the fairness core's inputs (GPU-seconds; jobs not finished)."""
    states = {
        t.tenant: TenantState(t.tenant, round(t.quota), held.get(t.tenant, 0), t.used * HOUR_S, t.entitled * HOUR_S,
                              share=t.share)
        for t in tenants.tenants
    }
    views = {
        j.job_id: JobView(j.job_id, j.tenant, j.gpus, j.submitted_unix_seconds, j.used * HOUR_S, j.deserved * HOUR_S,
                          j.pending_since_unix_seconds or None)
        for j in jobs.jobs
        if common_pb2.JobState.Name(j.job_state).removeprefix("JOB_STATE_") not in jobstate.FINAL_STATES
    }
    return FairInputs(states, views, config)
