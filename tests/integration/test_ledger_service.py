"""LedgerService over real gRPC and PostgreSQL: the docs/design.md §4 numbers through the SDK and the
CLI, who sees what, and the errors. The server is the real servicer behind the real
interceptor (tokens, error mapping); the SDK talks to it directly, as it would through
the api's forwarding.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from ledger_fixtures import ADMIN, LedgerServer, add_job, add_node, add_placement, add_tenant

from rota.allocator.ledger_link import LedgerStandings
from rota.cli.main import main as rota_main
from rota.client import Client, InvalidArgumentError, PermissionDeniedError
from rota.cluster.models import JobArrayRow, JobRow, JobTransitionRow
from rota.common.db import Database
from rota.core.fairness.ltgf import FairnessConfig
from rota.core.planning.planner import FairInputs
from rota.ledger import repository
from rota.ledger.collector import collect_all
from rota.v1 import ledger_pb2

H = timedelta(hours=1)
HOURS = 3600.0
SMALL = "small-secret"


@pytest.fixture
def db(databases: Any) -> Iterator[Database]:
    with databases.migrated() as private:
        yield private


@pytest.fixture
def server(db: Database) -> Iterator[LedgerServer]:
    s = LedgerServer(db)
    yield s
    s.stop()


def history(db: Database) -> datetime:
    """Shares 1 and 3 on 8 live GPUs (a dead node's 8 do not count): quotas 2 and 6.

    From ref = now - 6 h:
      small: s1 (4 GPUs) waits 1 h, runs 2 h.
      big:   b1 (2 GPUs) runs 4 h from ref; b2 (8 GPUs) waits from ref+1h and is cancelled at ref+2h.
    """
    now = db.run(repository.db_now)
    ref = now - 6 * H
    add_tenant(db, "small", 1.0, created=now - 48 * H, token=SMALL)
    add_tenant(db, "big", 3.0, created=now - 48 * H)
    add_node(db, "n1", 8, at=now)
    add_node(db, "n2", 8, health="DEAD", at=now)
    add_job(db, "s1", "small", 4, ref, finished=ref + 3 * H)
    add_placement(db, "s1", "n1", [0, 1, 2, 3], ref + H, ref + 3 * H)
    add_job(db, "b1", "big", 2, ref, finished=ref + 4 * H)
    add_placement(db, "b1", "n1", [4, 5], ref, ref + 4 * H)
    add_job(db, "b2", "big", 8, ref + H, finished=ref + 2 * H, state="CANCELLED")
    collect_all(db)
    return ref


def test_standings_follow_the_spec_definitions(db: Database, server: LedgerServer) -> None:
    history(db)
    with Client.connect(server.target, token=ADMIN) as client:
        st = client.standings()
    assert st.capacity_gpus == 8
    assert st.at is not None and st.window_start is not None
    span_h = (st.at - st.window_start).total_seconds() / HOURS
    assert 23 <= span_h <= 24  # 24 hourly buckets, the current one partly elapsed
    got = {t.tenant: t for t in st.tenants}
    small, big = got["small"], got["big"]
    assert (small.quota, big.quota) == (2, 6)
    second = 1 / HOURS  # the reply's times are whole seconds
    assert small.entitled == pytest.approx(2 * span_h, abs=2 * second)
    assert big.entitled == pytest.approx(6 * span_h, abs=6 * second)
    # small demands 4 for 3 h, capped at its quota 2; it ran 4 GPUs for 2 h.
    assert small.deserved == pytest.approx(2 * 3) and small.used == pytest.approx(4 * 2)
    # big demands 2 for 4 h, plus 8 more in the second hour (capped at 6 that hour).
    assert big.deserved == pytest.approx(2 * 1 + 6 * 1 + 2 * 2) and big.used == pytest.approx(2 * 4)
    assert small.fairness == pytest.approx(small.used / small.deserved)
    assert big.fairness is not None and small.fairness is not None
    assert big.fairness == pytest.approx(big.used / big.deserved) and big.fairness < 1 < small.fairness


def test_job_fairness_follows_the_spec_definitions(db: Database, server: LedgerServer) -> None:
    history(db)
    with Client.connect(server.target, token=ADMIN) as client:
        jobs = {j.job_id: j for j in client.job_fairness()}
    assert set(jobs) == {"s1", "b1", "b2"}
    # s1 alone in small: s = Q = 2 from arrival for 3 h; it ran 4 GPUs for 2 h.
    assert jobs["s1"].deserved == pytest.approx(2 * 3) and jobs["s1"].used == pytest.approx(4 * 2)
    # big's quota 6 is split 3/3 while b1 and b2 are both active (equal priorities): b1 is
    # capped by its own 2 GPUs throughout; b2 deserved 3 for its 1 h and got nothing.
    assert jobs["b1"].deserved == pytest.approx(2 * 4) and jobs["b1"].fairness == pytest.approx(1.0)
    # b2 never started: its D says it was owed; F (use set against share) does not apply.
    assert jobs["b2"].deserved == pytest.approx(3 * 1) and jobs["b2"].fairness is None
    assert jobs["b2"].state == "CANCELLED" and jobs["b2"].gpus == 8


def test_usage_totals_agree_by_tenant_job_day_and_gpu(db: Database, server: LedgerServer) -> None:
    ref = history(db)
    with Client.connect(server.target, token=ADMIN) as client:
        by = {k: {r.key: r.gpu_hours for r in client.usage(by=k)} for k in ("tenant", "job", "day", "gpu")}
        recent = {r.key: r.gpu_hours for r in client.usage(by="job", since=ref + 2 * H)}
    assert by["tenant"] == pytest.approx({"small": 8.0, "big": 8.0})
    assert by["job"] == pytest.approx({"s1": 8.0, "b1": 8.0})
    assert set(by["gpu"]) == {f"n1/{i}" for i in range(6)}
    totals = [sum(v.values()) for v in by.values()]
    assert totals == pytest.approx([totals[0]] * 4)
    # Clipped at `since` (sent in whole seconds, so up to a second more per GPU).
    assert recent == pytest.approx({"s1": 4 * 1.0, "b1": 2 * 2.0}, abs=4 / HOURS)


def test_a_tenant_token_sees_only_its_own_tenant(db: Database, server: LedgerServer) -> None:
    history(db)
    with Client.connect(server.target, token=SMALL) as client:
        assert {r.key for r in client.usage(by="job")} == {"s1"}
        assert {r.key for r in client.usage(tenant="big", by="job")} == {"s1"}  # the filter is forced
        assert [t.tenant for t in client.standings().tenants] == ["small"]
        assert {j.job_id for j in client.job_fairness(tenant="big")} == {"s1"}
        with pytest.raises(PermissionDeniedError):
            client._call(client._ledger.RecordUsage, ledger_pb2.RecordUsageRequest(lease_id="x"))


def test_a_bad_grouping_is_an_invalid_argument_naming_the_field(db: Database, server: LedgerServer) -> None:
    with Client.connect(server.target, token=ADMIN) as client, pytest.raises(InvalidArgumentError) as err:
        client.usage(by="week")
    assert err.value.field == "by"


def test_record_usage_through_grpc_is_idempotent(db: Database, server: LedgerServer) -> None:
    history(db)
    start = int((db.run(repository.db_now) - 30 * H).timestamp()) // 3600 * 3600 * 1000
    request = ledger_pb2.RecordUsageRequest(
        lease_id="external-1", sequence=0, job_id="ext", tenant="small", node="n9", gpus=[0],
        start_unix_ms=start, end_unix_ms=start + 1_800_000,
    )
    with Client.connect(server.target, token=ADMIN) as client:
        assert client._call(client._ledger.RecordUsage, request).recorded
        assert not client._call(client._ledger.RecordUsage, request).recorded
        assert {r.key: r.gpu_hours for r in client.usage(by="job")}["ext"] == pytest.approx(0.5)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        rota_main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def test_cli_usage_and_fairness(db: Database, server: LedgerServer, capsys: pytest.CaptureFixture[str]) -> None:
    history(db)
    conn = ["--endpoint", server.target, "--token", ADMIN]
    code, out, _ = run_cli(capsys, "usage", "--by", "job", "--since", "7d", "--json", *conn)
    data = json.loads(out)
    assert code == 0 and data["by"] == "job"
    assert {r["key"]: r["gpu_hours"] for r in data["rows"]} == pytest.approx({"s1": 8.0, "b1": 8.0})
    assert data["total_gpu_hours"] == pytest.approx(16.0)
    code, out, _ = run_cli(capsys, "usage", *conn)
    assert code == 0 and out.splitlines()[0].split() == ["TENANT", "GPU-H", "WEIGHTED", "GPU-H"] and "total" in out
    code, out, _ = run_cli(capsys, "fairness", "--json", *conn)
    tenants = {t["tenant"]: t for t in json.loads(out)["tenants"]}
    assert code == 0 and tenants["small"]["quota"] == 2 and tenants["big"]["deserved"] == pytest.approx(12.0)
    code, out, _ = run_cli(capsys, "fairness", "--jobs", "--tenant", "big", *conn)
    assert code == 0 and "b2" in out and "s1" not in out
    code, out, _ = run_cli(capsys, "fairness", *conn)
    assert code == 0 and "QUOTA" in out and "small" in out
    code, _, err = run_cli(capsys, "usage", "--by", "week", *conn)
    assert code != 0 and len(err.strip().splitlines()) == 1 and "by" in err


def test_capacity_is_the_live_gpus_not_the_last_jobs_gpus(
    db: Database, server: LedgerServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """G is the live nodes' GPUs, whatever the GPU counts of the jobs in the window."""
    now = db.run(repository.db_now)
    add_tenant(db, "solo", 1.0, created=now - 48 * H)
    add_node(db, "n1", 4, at=now)
    add_node(db, "n2", 4, at=now)
    add_job(db, "one", "solo", 1, now - H)  # one GPU, pending: the only row of the jobs query
    with Client.connect(server.target, token=ADMIN) as client:
        assert client.standings().capacity_gpus == 8
    conn = ["--endpoint", server.target, "--token", ADMIN]
    code, out, _ = run_cli(capsys, "fairness", "--json", *conn)
    assert code == 0 and json.loads(out)["capacity_gpus"] == 8
    code, out, _ = run_cli(capsys, "fairness", *conn)
    assert code == 0 and "8 GPUs alive" in out.splitlines()[0]


def test_the_allocator_reads_tenant_and_job_standings_through_the_ledger_rpc(db: Database, server: LedgerServer) -> None:
    ref = history(db)
    add_job(db, "s2", "small", 1, ref + 5 * H)  # still pending

    async def read() -> FairInputs | None:
        return await LedgerStandings(server.target, ADMIN).fair_inputs(FairnessConfig(), {"big": 3})

    fair = asyncio.run(read())
    assert fair is not None
    assert (fair.tenants["small"].quota, fair.tenants["big"].quota) == (2, 6)
    assert fair.tenants["small"].used == pytest.approx(8 * HOURS) and fair.tenants["small"].allocated == 0
    assert fair.tenants["big"].allocated == 3  # what the allocator's own snapshot says is held
    assert set(fair.jobs) == {"s2"}  # only active jobs
    assert fair.jobs["s2"].pending_since == pytest.approx((ref + 5 * H).timestamp())
    assert fair.jobs["s2"].submit_s == pytest.approx((ref + 5 * H).timestamp())


def test_without_a_ledger_the_allocator_plans_without_standings() -> None:
    async def read() -> FairInputs | None:
        return await LedgerStandings("127.0.0.1:1", ADMIN).fair_inputs(FairnessConfig(), {})

    assert asyncio.run(read()) is None


def test_f_reads_n_a_where_it_does_not_apply_and_held_array_tasks_demand_nothing(
    db: Database, server: LedgerServer, capsys: pytest.CaptureFixture[str],
) -> None:
    """The newcomer's figures: the only tenant of an idle cluster ran an array of three
    1-GPU tasks with %1 one after the other (its third cancelled before it started), and
    paused a job after an hour; a second tenant never submitted anything."""
    now = db.run(repository.db_now)
    ref = now - 6 * H
    add_tenant(db, "solo", 1.0, created=now - 48 * H)
    add_tenant(db, "idle", 1.0, created=now - 48 * H)
    add_node(db, "n1", 8, at=now)

    def rows(s: Any) -> None:
        s.add(JobArrayRow(id="arr", tenant="solo", name="arr", count=3, max_running=1, spec_hash="-"))
        s.flush()
        for i, (started, finished, state) in enumerate([(ref, ref + H, "SUCCEEDED"), (ref + H, ref + 2 * H, "SUCCEEDED"),
                                                        (None, ref + 2 * H, "CANCELLED")]):
            s.add(JobRow(id=f"arr_{i}", tenant="solo", name="arr", kind="training", priority=5, gpus=1, spec={},
                         spec_hash="-", state=state, created_at=ref, started_at=started, finished_at=finished,
                         array_id="arr", array_index=i))
        s.add(JobRow(id="paused", tenant="solo", name="p", kind="training", priority=5, gpus=1, spec={}, spec_hash="-",
                     state="PAUSED", created_at=ref + 3 * H, started_at=ref + 3 * H))
        s.flush()
        s.add(JobTransitionRow(job_id="paused", from_state="RUNNING", to_state="PAUSED", reason="paused",
                               at=ref + 4 * H))

    db.run(rows)
    add_placement(db, "arr_0", "n1", [0], ref, ref + H)
    add_placement(db, "arr_1", "n1", [0], ref + H, ref + 2 * H)
    add_placement(db, "paused", "n1", [1], ref + 3 * H, ref + 4 * H)
    collect_all(db)
    with Client.connect(server.target, token=ADMIN) as client:
        tenants = {t.tenant: t for t in client.standings().tenants}
        jobs = {j.job_id: j for j in client.job_fairness()}
    # Demand: each task only while the cap let it run, the paused job until its pause. The
    # only tenant, served at once, reads F 1 (counting held tasks and the pause as demand,
    # as before: 3 GPU-h used of 8 deserved, F 0.38).
    assert tenants["solo"].deserved == pytest.approx(3.0) and tenants["solo"].fairness == pytest.approx(1.0)
    assert tenants["idle"].deserved == 0.0 and tenants["idle"].fairness is None  # no demand: n/a
    assert jobs["arr_2"].deserved == 0.0 and jobs["arr_2"].fairness is None  # held, then cancelled unstarted
    assert jobs["arr_0"].fairness == pytest.approx(1.0) and jobs["arr_1"].fairness == pytest.approx(1.0)
    assert jobs["paused"].deserved == pytest.approx(1.0) and jobs["paused"].fairness is None  # not runnable now
    code, out, _ = run_cli(capsys, "fairness", "--endpoint", server.target, "--token", ADMIN)
    assert code == 0 and next(line for line in out.splitlines() if line.startswith("idle")).split()[-1] == "n/a"
    code, out, _ = run_cli(capsys, "fairness", "--jobs", "--json", "--endpoint", server.target, "--token", ADMIN)
    assert {j["job_id"]: j["fairness"] for j in json.loads(out)["jobs"]}["paused"] is None  # JSON null, not NaN


@pytest.mark.parametrize(("policy", "lease_s", "header"), [
    ("fair", 5.0, "policy: fair (lease 5s): over-share tenants' preemptible jobs yield"),
    ("fair", 1800.0, "policy: fair (lease 30m)"),
    ("fast", 1800.0, "policy: fast: waiting jobs go to the tenant furthest below its share first"),
    ("fifo", 1800.0, "policy: fifo: arrival order; shares are not used"),
])
def test_fairness_says_which_policy_decides(
    db: Database, capsys: pytest.CaptureFixture[str], policy: str, lease_s: float, header: str
) -> None:
    """The SDK, `rota fairness` and its --json name the cluster's policy; a lease only under fair."""
    history(db)
    server = LedgerServer(db, policy=policy, lease_s=lease_s)
    try:
        with Client.connect(server.target, token=ADMIN) as client:
            st = client.standings()
        assert (st.policy, st.lease_seconds) == (policy, lease_s if policy == "fair" else 0.0)
        conn = ["--endpoint", server.target, "--token", ADMIN]
        code, out, _ = run_cli(capsys, "fairness", "--json", *conn)
        assert code == 0 and json.loads(out)["policy"] == policy
        code, out, _ = run_cli(capsys, "fairness", *conn)
        assert code == 0 and any(line.startswith(header) for line in out.splitlines()), out
    finally:
        server.stop()
