"""`rota sim --json`: every fairness figure recomputed from `jobs[].intervals` (with each job's
submit, end and GPUs, the JSON's `gpus` and `shares`) by code written independently of
rota.sim.metrics, for both definitions of a tenant's deserved share:

- ASTRAEA's: D_u = ∫ min(demand_u, Q_u) dt, Q_u = floor(G · share_u / Σ share);
- water-filling: D_u = ∫ λ(t)-capped share dt, deserved_u = min(demand_u, λ · share_u) with the
  level λ that hands out min(G, Σ demand) (found by bisection here, by rounds in the core).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rota.core.fairness.waterfill import waterfill
from rota.sim.cli import main

Segment = tuple[float, float, dict[str, float]]  # [a, b) and each tenant's demand in it


def _segments(jobs: list[dict[str, Any]], tenants: list[str]) -> list[Segment]:
    cuts = sorted({j["submit_s"] for j in jobs} | {j["end_s"] for j in jobs})
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        mid = (a + b) / 2
        out.append((a, b, {t: float(sum(j["gpus"] for j in jobs if j["tenant"] == t
                                         and j["submit_s"] <= mid < j["end_s"])) for t in tenants}))
    return out


def _level_share(gpus: float, demand: dict[str, float], shares: dict[str, float]) -> dict[str, float]:
    total = min(gpus, sum(demand.values()))
    lo, hi = 0.0, gpus / min(s for s in shares.values() if s > 0) + max(demand.values(), default=0.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(min(d, mid * shares[t]) for t, d in demand.items()) < total else (lo, mid)
    return {t: min(d, hi * shares[t]) for t, d in demand.items()}


def _tenant_f(run: dict[str, Any], gpus: int, shares: dict[str, float],
              deserve: Callable[[dict[str, float]], dict[str, float]]) -> dict[str, float]:
    deserved = dict.fromkeys(shares, 0.0)
    for a, b, demand in _segments(run["jobs"], list(shares)):
        for t, d in deserve(demand).items():
            deserved[t] += d * (b - a)
    used = dict.fromkeys(shares, 0.0)
    for j in run["jobs"]:
        used[j["tenant"]] += j["gpus"] * sum(y - x for x, y in j["intervals"])
    return {t: used[t] / d for t, d in deserved.items() if d > 0}


def _job_f(run: dict[str, Any], gpus: int, shares: dict[str, float]) -> list[float]:
    quota = {t: math.floor(gpus * s / sum(shares.values()) + 1e-9) for t, s in shares.items()}
    jobs = run["jobs"]
    deserved = [0.0] * len(jobs)
    for a, b, _ in _segments(jobs, list(shares)):
        mid = (a + b) / 2
        live = [k for k, j in enumerate(jobs) if j["submit_s"] <= mid < j["end_s"]]
        for k in live:  # equal priorities: an equal part of the tenant's quota, capped at the job's GPUs
            mates = sum(1 for m in live if jobs[m]["tenant"] == jobs[k]["tenant"])
            deserved[k] += min(jobs[k]["gpus"], quota[jobs[k]["tenant"]] / mates) * (b - a)
    return [j["gpus"] * sum(y - x for x, y in j["intervals"]) / d if d > 0 else 1.0
            for j, d in zip(jobs, deserved, strict=True)]


def _jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


@pytest.fixture
def contended(tmp_path: Path) -> tuple[Path, Path]:
    rng = random.Random(7)
    rows = [f"j{k},{rng.choice('aabbbc')},{rng.uniform(0, 20000):.1f},{rng.uniform(300, 9000):.1f},"
            f"{rng.choice([1, 1, 2, 4])}" for k in range(60)]
    (tmp_path / "JOBS.csv").write_text("job_id,tenant,submit_s,duration_s,gpus\n" + "\n".join(rows) + "\n")
    (tmp_path / "TENANTS.csv").write_text("tenant,share\na,1\nb,3\nc,2\n")
    return tmp_path / "JOBS.csv", tmp_path / "TENANTS.csv"


def test_every_fairness_figure_is_recomputed_from_the_intervals_alone(
    contended: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    jobs, tenants = contended
    assert main(["--trace", str(jobs), "--tenants", str(tenants), "--gpus", "8", "--lease-s", "900", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    gpus, shares = out["gpus"], out["shares"]
    quota = {t: math.floor(gpus * s / sum(shares.values()) + 1e-9) for t, s in shares.items()}
    for run in out["policies"].values():
        astraea = _tenant_f(run, gpus, shares, lambda d: {t: min(x, quota[t]) for t, x in d.items()})
        wf = _tenant_f(run, gpus, shares, lambda d: _level_share(gpus, d, shares))
        jf = _job_f(run, gpus, shares)
        assert run["tenant_f"] == pytest.approx(astraea, abs=1e-4)
        assert run["tenant_f_min"] == pytest.approx(min(astraea.values()))
        assert run["tenant_jain"] == pytest.approx(_jain(list(astraea.values())))
        assert run["tenant_f_max_min"] == pytest.approx(max(astraea.values()) / min(astraea.values()))
        assert run["tenant_f_waterfill"] == pytest.approx(wf, abs=1e-4)
        assert run["tenant_waterfill_max_min"] == pytest.approx(max(wf.values()) / min(wf.values()))
        assert run["tenant_waterfill_mean_dev"] == pytest.approx(sum(abs(f - 1) for f in wf.values()) / len(wf))
        assert run["job_f_in_band"] == pytest.approx(sum(0.95 <= f <= 1.05 for f in jf) / len(jf))
        assert run["preemptions"] == sum(len(j["intervals"]) - 1 for j in run["jobs"])
        assert run["avg_jct_s"] == pytest.approx(sum(j["end_s"] - j["submit_s"] for j in run["jobs"]) / len(jf))
    # The two readings differ on this trace: a tenant idle part of the time leaves GPUs the
    # water-filling share hands on, while ASTRAEA's min(demand, quota) forgets them.
    fair = out["policies"]["fair"]
    assert fair["tenant_f_waterfill"] != pytest.approx(fair["tenant_f"], abs=1e-3)


def test_waterfill_by_hand() -> None:
    # 12 GPUs, shares 1:2:3. a asks 1 (satisfied), the 11 left split 2:3 but b asks only 3.
    assert waterfill(12, {"a": 1, "b": 3, "c": 20}, {"a": 1, "b": 2, "c": 3}) == {"a": 1.0, "b": 3.0, "c": 8.0}
    # Nobody satisfied: strictly proportional to the shares.
    assert waterfill(12, {"a": 9, "b": 9, "c": 9}, {"a": 1, "b": 2, "c": 3}) == pytest.approx({"a": 2, "b": 4, "c": 6})
    # Demand below capacity: everyone gets what it asks; no demand, nothing.
    assert waterfill(12, {"a": 2, "b": 0, "c": 5}, {"a": 1, "b": 2, "c": 3}) == {"a": 2.0, "b": 0.0, "c": 5.0}
    # A tenant without a share gets only what the weighted ones leave.
    assert waterfill(6, {"a": 4, "z": 9}, {"a": 1}) == {"a": 4.0, "z": 2.0}
