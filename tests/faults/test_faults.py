"""Faults injected into a real local cluster, sized for CI: `rota bench faults` runs more rounds.

Whatever crashes (the leading allocator, Redis, an agent killed or frozen) and however a
client retries, no submitted job is lost or run twice, no GPU is double-booked, no job
runs on two nodes at once, no GPU-second is lost or counted twice, and hostile calls get
the status they must.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from rota.bench.fault_harness import Harness
from rota.bench.faults import redis_kills, run_suite

ROUNDS = 10


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, databases: Any) -> Any:
    url = databases.create()
    # No Redis URL: the cluster starts (and owns) an embedded Redis server, so the suite
    # may kill it; a shared one is only flushed (see test_a_shared_redis_is_not_killed).
    harness = Harness(Path(tmp_path_factory.mktemp("faults")) / "home", url, "")
    try:
        harness.start()
        yield run_suite(harness, ROUNDS)
    finally:
        harness.stop()
        databases.drop(url)


def test_no_job_is_lost_or_run_twice(report: Any) -> None:
    assert report["jobs"] >= 2 * ROUNDS
    assert report["lost_jobs"] == 0, report["not_succeeded"]
    assert report["duplicated_jobs"] == 0
    assert report["cases"]["replayed_submissions"]["duplicates"] == 0
    assert report["cases"]["replayed_submissions"]["different_body_already_exists"] is True


def test_no_gpu_is_double_booked_and_no_job_runs_on_two_nodes(report: Any) -> None:
    assert report["double_booked_gpus"] == 0, report["sightings"]
    assert report["two_running_copies"] == 0, report["sightings"]


def test_a_gang_that_loses_a_node_stops_whole_and_runs_again(report: Any) -> None:
    # Its job is among the submitted ones: it succeeded (no lost job), no rank of the old
    # epoch ran beside the new one (no two running copies), and it was billed on each node.
    gang = report["cases"]["gang_node_kill"]
    assert gang["rounds"] == 1 and gang["gang_stopped_after_s"]["n"] == 1
    # On the surviving node, the old epoch's rank processes (by pid, from /proc) were gone
    # before they could have ended on their own: its agent stopped them.
    assert gang["survivors_left"] == 0 and gang["survivors_gone_after_s"]["n"] == 1, gang


def test_every_gpu_second_is_counted_once(report: Any) -> None:
    assert report["ledger_mismatches"] == 0


def test_the_standby_allocator_takes_over_and_state_is_rebuilt(report: Any) -> None:
    cases = report["cases"]
    assert cases["allocator_kill"]["takeover_s"]["n"] == ROUNDS
    assert cases["redis_flush"]["stale_epoch_refused"] is True
    killed = cases["redis_kill"]
    assert "skipped" not in killed, killed
    assert killed["rebuilt_s"]["n"] == killed["rounds"] >= 1 and killed["restarts"] >= killed["rounds"]
    assert killed["stale_epoch_refused"] is True
    assert cases["agent_kill_and_freeze"]["dead_after_s"]["n"] >= 2


def test_hostile_calls_get_the_status_they_must(report: Any) -> None:
    checked = {name: r for name, r in report["cases"]["security"].items() if "ok" in r}
    assert checked and all(r["ok"] for r in checked.values()), checked


def test_a_database_outage_reads_as_unavailable_never_internal_and_heals_by_itself(report: Any) -> None:
    outage = report["cases"]["postgres_outage"]
    assert outage["internal_errors"] == 0, outage
    assert set(outage["status_codes_during"]) <= {"OK", "UNAVAILABLE", "DEADLINE_EXCEEDED"}, outage
    assert outage["recovered_after_s"] < 60


def test_jitter_is_no_death_and_a_real_cut_is(report: Any) -> None:
    partition = report["cases"]["partition"]
    assert partition["false_dead_samples"] == 0, partition
    assert partition["cut_dead_after_s"] < 10, partition


def test_a_node_cut_off_from_the_api_has_its_jobs_stopped_there_once_it_is_dead(report: Any) -> None:
    # Its agent lives on (its launchers' lease stays fresh), so nothing but the allocator's
    # stop ends the copy there before the job, requeued, may run elsewhere.
    partition = report["cases"]["partition"]
    assert partition["stranded_job"], partition  # a job ran on the node when it was cut off
    assert partition["stranded_stopped_after_dead_s"] is not None, partition


class _SharedRedisCluster(Harness):
    """A cluster started with --redis-url: its cluster.json names no Redis process."""

    @property
    def info(self) -> dict[str, Any]:
        return {"redis_url": "redis://127.0.0.1:6379/0", "redis_prefix": "rota:x", "redis_pid": 0, "agents": {}}


def test_a_shared_redis_is_not_killed_and_the_report_says_why(tmp_path: Path) -> None:
    killed = redis_kills(_SharedRedisCluster(tmp_path), rounds=3, rng=random.Random(1))
    assert killed["rounds"] == 0 and "not its own process" in killed["skipped"]
