"""`rota sim` with jobs larger than a node, node GPU types and switches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rota.core.planning.constraints import StartMasks
from rota.core.planning.liveplan import Horizon, LiveNode, build
from rota.sim.cli import main
from rota.sim.engine import Run, SimConfig, Simulator
from rota.sim.orderings import POLICIES
from rota.sim.traces import add_types
from rota.sim.workload import Job, parse_gpu_types, read_jobs, write_jobs

TYPES = ("a100", "a100", "h100", "h100")  # four nodes of 2 GPUs


class Recording(Simulator):
    """Remembers every (job, first GPU) it starts, preempted jobs' later intervals included."""

    starts: list[tuple[Job, int]]

    def _start(self, r: Run, off: int, now: float) -> None:
        self.__dict__.setdefault("starts", []).append((r.job, off))
        super()._start(r, off, now)


def simulate(jobs: list[Job], policy: str, gpus: int = 8, gpn: int = 2, **cfg: tuple[str, ...]) -> Recording:
    sim = Recording(jobs, {"a": 1, "b": 1}, SimConfig(gpus, gpn, **cfg), POLICIES[policy]())  # type: ignore[arg-type]
    sim.run()
    return sim


@pytest.mark.parametrize("policy", list(POLICIES))
def test_jobs_larger_than_a_node_get_whole_aligned_nodes(policy: str) -> None:
    jobs = [Job(f"j{i}", "ab"[i % 2], i * 50.0, 400.0, gpus) for i, gpus in enumerate([16, 8, 1, 32, 2, 16, 4, 8])]
    sim = simulate(jobs, policy, gpus=32, gpn=8)
    assert {j.id for j, _ in sim.starts} == {j.id for j in jobs}
    for job, off in sim.starts:
        assert off % job.gpus == 0
        if job.gpus >= 8:
            assert off % 8 == 0 and (off + job.gpus) % 8 == 0  # whole nodes


@pytest.mark.parametrize("policy", list(POLICIES))
def test_typed_jobs_land_only_on_nodes_of_their_type(policy: str) -> None:
    jobs = [Job(f"u{i}", "a", i * 10.0, 300.0, 2) for i in range(4)]
    jobs += [Job(f"h{i}", "b", 5 + i * 10.0, 200.0, g, gpu_types=frozenset({"h100"})) for i, g in enumerate([1, 2, 4, 1])]
    sim = simulate(jobs, policy, node_types=TYPES)
    typed = [(job, off) for job, off in sim.starts if job.gpu_types]
    assert {j.id for j, _ in typed} == {"h0", "h1", "h2", "h3"}
    for job, off in typed:
        assert {TYPES[g // 2] for g in range(off, off + job.gpus)} == {"h100"}, (job.id, off)


def test_a_same_switch_gang_waits_for_a_block_under_one_switch() -> None:
    # Switches s0, s0, s0, s1: of the two aligned 2-node blocks only the first is under one.
    switches = ("s0", "s0", "s0", "s1")
    jobs = [Job("hold", "a", 0.0, 100.0, 4), Job("gang", "b", 1.0, 50.0, 4, same_switch=True)]
    sim = simulate(jobs, "fifo", node_switches=switches)
    assert [(j.id, off) for j, off in sim.starts] == [("hold", 0), ("gang", 0)]
    free = simulate([Job("hold", "a", 0.0, 100.0, 4), Job("gang", "b", 1.0, 50.0, 4)], "fifo", node_switches=switches)
    assert [(j.id, off) for j, off in free.starts] == [("hold", 0), ("gang", 4)]  # without the ask it spans two


def test_the_sim_allows_exactly_the_starts_the_live_planner_allows() -> None:
    live = build([LiveNode(f"n{i}", 2, gpu_type=t, switch=f"s{i // 3}") for i, t in enumerate(TYPES)], [],
                 Horizon(60.0, 4, 0.0))
    masks = StartMasks(live.scenario)
    sim = Simulator([Job("h", "a", 0, 1, 2, gpu_types=frozenset({"h100"})), Job("g", "a", 0, 1, 4, same_switch=True)],
                    {"a": 1}, SimConfig(8, 2, node_types=TYPES, node_switches=("s0", "s0", "s0", "s1")),
                    POLICIES["fifo"]())
    for run in sim.runs:
        assert run.allowed == masks.allowed_for(run.job.gpu_types, run.job.same_switch, run.job.gpus)


def test_a_cluster_that_is_no_power_of_two_keeps_its_aligned_typed_blocks() -> None:
    # 24 GPUs, nodes h100, h100, a100: the 16-GPU h100 job has one block, at 0.
    jobs = [Job("h", "a", 0, 10, 16, gpu_types=frozenset({"h100"})), Job("a", "a", 0, 10, 8, gpu_types=frozenset({"a100"}))]
    sim = simulate(jobs, "fifo", gpus=24, gpn=8, node_types=("h100", "h100", "a100"))
    assert sorted((j.id, off) for j, off in sim.starts) == [("a", 16), ("h", 0)]


@pytest.mark.parametrize(("job", "message"), [
    (Job("x", "a", 0, 1, 1, gpu_types=frozenset({"v100"})), "no aligned block of 1 GPUs of type v100"),
    (Job("x", "a", 0, 1, 8, gpu_types=frozenset({"h100"})), "of type h100"),
])
def test_a_job_no_block_can_hold_is_refused(job: Job, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Simulator([job], {"a": 1}, SimConfig(8, 2, node_types=TYPES), POLICIES["fifo"]())
    with pytest.raises(ValueError, match="node_types has 2 entries"):
        Simulator([], {"a": 1}, SimConfig(8, 2, node_types=("a", "b")), POLICIES["fifo"]())


def test_types_and_switches_round_trip_in_the_trace_and_untyped_traces_keep_their_columns(tmp_path: Path) -> None:
    jobs = [Job("x", "a", 0, 10, 4, gpu_types=frozenset({"h100", "a100"}), same_switch=True), Job("y", "a", 1, 10, 1)]
    write_jobs(tmp_path / "typed.csv", jobs)
    assert read_jobs(tmp_path / "typed.csv") == jobs
    write_jobs(tmp_path / "plain.csv", [Job("y", "a", 1, 10, 1)])
    assert (tmp_path / "plain.csv").read_text().splitlines()[0] == "job_id,tenant,submit_s,duration_s,gpus,priority"


def test_add_types_types_a_fraction_only_with_types_that_can_hold_the_job() -> None:
    jobs = [Job(f"j{i}", "a", i, 10, g) for i, g in enumerate([1, 2, 4, 8] * 25)]
    assert add_types(jobs, TYPES, 2, 0.0) == jobs
    typed = add_types(jobs, TYPES, 2, 1.0, seed=3)
    assert typed == add_types(jobs, TYPES, 2, 1.0, seed=3)
    for before, after in zip(jobs, typed, strict=True):
        assert (before.id, before.gpus, before.duration_s) == (after.id, after.gpus, after.duration_s)
        assert len(after.gpu_types) == (1 if after.gpus <= 4 else 0)  # 8 GPUs: no type has 4 nodes
    assert {t for j in typed for t in j.gpu_types} == {"a100", "h100"}
    some = add_types(jobs, TYPES, 2, 0.3, seed=3)
    assert 10 < sum(1 for j in some if j.gpu_types) < 50


def test_parse_gpu_types() -> None:
    assert parse_gpu_types("a100:2,h100:1") == ("a100", "a100", "h100")
    with pytest.raises(ValueError, match="not TYPE:NODES"):
        parse_gpu_types("a100")


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "JOBS.csv").write_text(
        "job_id,tenant,submit_s,duration_s,gpus,priority,gpu_types,same_switch\n"
        "wide,a,0,1000,16,1,,0\nh,b,10,500,2,1,h100,0\ng,a,20,300,8,1,,1\nsmall,b,30,100,1,1,,0\n"
    )
    (tmp_path / "TENANTS.csv").write_text("tenant,share\na,1\nb,1\n")
    return tmp_path / "JOBS.csv", tmp_path / "TENANTS.csv"


def test_cli_replays_gangs_with_types_and_switches(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    jobs, tenants = trace
    args = ["--trace", str(jobs), "--tenants", str(tenants), "--gpus", "16", "--gpus-per-node", "4",
            "--gpu-types", "a100:2,h100:2", "--switches", "2"]
    assert main([*args, "--json", "--policy", "fifo,fair"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["gpu_types"] == "a100:2,h100:2" and out["config"]["nodes_per_switch"] == 2
    for policy in out["policies"].values():
        assert all(j["end_s"] is not None for j in policy["jobs"])
    assert main([*args, "--policy", "fifo"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "16 GPUs, 4 per node, types a100:2,h100:2, 2 nodes per switch"


@pytest.mark.parametrize(("extra", "message"), [
    (["--gpu-types", "a100:3"], "--gpu-types: names 3 nodes, the cluster has 4"),
    (["--gpu-types", "a100"], "not TYPE:NODES"),
    (["--switches", "0"], "nodes per switch must be at least 1"),
    (["--gpu-types", "a100:4"], "job h: no aligned block of 2 GPUs of type h100"),
])
def test_cli_placement_errors(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str], extra: list[str],
                              message: str) -> None:
    jobs, tenants = trace
    assert main(["--trace", str(jobs), "--tenants", str(tenants), "--gpus", "16", "--gpus-per-node", "4", *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_make_trace_needs_types_for_a_typed_fraction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["make-trace", "--out", str(tmp_path), "--typed-fraction", "0.2"]) == 1
    assert "--typed-fraction needs --gpu-types" in capsys.readouterr().err
