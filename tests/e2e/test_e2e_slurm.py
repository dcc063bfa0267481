"""Slurm's commands over a real local cluster: sbatch scripts with #SBATCH directives and
Slurm's variables, squeue/sacct formats, scancel, and submitit (installed from PyPI, unchanged)
driving the cluster through `sbatch`, `sacct`, `scancel`, `srun` and `scontrol` on the PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import REPO, RunningCluster, own_cluster, wait_until

pytestmark = pytest.mark.e2e

HELPERS = '''
import os
import time

import submitit


def multiply(a, b):
    return a * b, os.environ["SLURM_JOB_ID"], os.environ.get("SLURM_ARRAY_TASK_ID")


def sleep_for(seconds):
    time.sleep(seconds)
    return "slept"


class Counter(submitit.helpers.Checkpointable):
    """Counts to `total` a second a step; submitit's checkpoint() (inherited) keeps the count."""

    def __init__(self):
        self.done = 0

    def __call__(self, total):
        while self.done < total:
            time.sleep(1)
            self.done += 1
        return self.done, os.environ["SLURM_RESTART_COUNT"]
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """submitit from PyPI in a folder of its own (the test venv stays as it is)."""
    folder = tmp_path_factory.mktemp("submitit-site")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(folder), "submitit"],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        pytest.skip(f"submitit could not be installed from PyPI (unreachable?): {result.stderr.strip()[-300:]}")
    (folder / "slurm_helpers.py").write_text(HELPERS)
    return folder


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("slurm-bin")
    subprocess.run([sys.executable, "-m", "rota.cli.main", "slurm-shims", str(folder)], check=True, cwd=REPO)
    return folder


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str, site: Path,
            shims: Path) -> Iterator[RunningCluster]:
    path = f"{shims}:{os.environ['PATH']}"
    python_path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    yield from own_cluster(tmp_path_factory, databases, redis_url, "slurm", nodes=2, gpus_per_node=2,
                           extra_env={"PATH": path, "PYTHONPATH": python_path})


@pytest.fixture(scope="module")
def login(cluster: RunningCluster, site: Path, shims: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """This process as a Slurm login shell: the plain names on the PATH, tenant demo's token."""
    spool = tmp_path_factory.mktemp("spool")
    env = {"PATH": f"{shims}:{os.environ['PATH']}", "ROTA_HOME": str(cluster.home), "ROTA_TOKEN": cluster.demo_token,
           "ROTA_SLURM_SPOOL": str(spool), "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.path.insert(0, str(site))
    try:
        yield env
    finally:
        sys.path.remove(str(site))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def slurm(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A Slurm command as a user types it; a job's default output lands in `cwd` (never the checkout)."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, cwd=cwd or Path.home())


def sacct_state(number: str) -> str:
    out = slurm("sacct", "-j", number, "-o", "JobID,State", "--parsable2", "-n").stdout.strip()
    return out.split("|")[1] if out else ""


def test_sbatch_runs_the_script_with_slurms_variables(login: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "vars.sh"
    script.write_text(textwrap.dedent("""\
        #!/bin/bash
        #SBATCH --job-name=vars
        #SBATCH --gres=gpu:2
        #SBATCH --ntasks-per-node=2
        #SBATCH --time=5:00
        #SBATCH --output=%x-%j.out
        #SBATCH --account=demo
        env | grep '^SLURM_' | sort
        srun --output=task-%j-%t.out sh -c 'echo task $SLURM_PROCID of $SLURM_NTASKS local $SLURM_LOCALID'
        """))
    submitted = slurm("sbatch", str(script), cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    number = re.fullmatch(r"Submitted batch job (\d+)\n", submitted.stdout).group(1)  # type: ignore[union-attr]
    wait_until(lambda: sacct_state(number) == "COMPLETED", 90, f"job {number} COMPLETED")
    variables = dict(line.split("=", 1) for line in (tmp_path / f"vars-{number}.out").read_text().splitlines())
    assert variables["SLURM_JOB_ID"] == number
    assert variables["SLURM_JOB_NAME"] == "vars"
    assert variables["SLURM_NTASKS"] == "2" and variables["SLURM_JOB_NUM_NODES"] == "1"
    assert variables["SLURM_JOB_NODELIST"] in {"node[0-1]", "node0", "node1"} or variables["SLURM_JOB_NODELIST"]
    assert len(variables["SLURM_JOB_GPUS"].split(",")) == 2
    tasks = sorted((tmp_path / f"task-{number}-{t}.out").read_text().strip() for t in (0, 1))
    assert tasks == ["task 0 of 2 local 0", "task 1 of 2 local 1"]
    row = slurm("sacct", "-j", number, "--format", "JobID,JobName,Account,State,ExitCode", "-P").stdout.splitlines()
    assert row == ["JobID|JobName|Account|State|ExitCode", f"{number}|vars|demo|COMPLETED|0:0"]


def test_a_two_node_job_runs_its_steps_on_both_nodes(login: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "two.sh"
    script.write_text(textwrap.dedent("""\
        #!/bin/bash
        #SBATCH --nodes=2 --gres=gpu:2 --ntasks-per-node=2 --time=5 --output=two-%j.out
        echo batch on $SLURMD_NODENAME of $SLURM_JOB_NODELIST
        srun --output=two-%j-%t.out sh -c 'echo $SLURM_PROCID $SLURM_NODEID $SLURM_LOCALID $SLURM_NTASKS $SLURMD_NODENAME'
        """))
    number = slurm("sbatch", "--parsable", str(script), cwd=tmp_path).stdout.strip()
    assert number.isdigit()
    wait_until(lambda: sacct_state(number) == "COMPLETED", 90, f"job {number} COMPLETED")
    assert (tmp_path / f"two-{number}.out").read_text().startswith("batch on node-")
    tasks = [(tmp_path / f"two-{number}-{t}.out").read_text().split() for t in range(4)]
    assert [t[:4] for t in tasks] == [["0", "0", "0", "4"], ["1", "0", "1", "4"], ["2", "1", "0", "4"], ["3", "1", "1", "4"]]
    assert {t[4] for t in tasks[:2]} != {t[4] for t in tasks[2:]}  # two nodes
    nodelist = slurm("sacct", "-j", number, "-o", "NodeList", "-P", "-n").stdout.strip()
    assert nodelist == "node-[1-2]"


def test_the_time_limit_signals_the_batch_shell_then_ends_the_job_timeout(login: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "late.sh"
    script.write_text(textwrap.dedent("""\
        #!/bin/bash
        #SBATCH --time=0:20 --signal=B:USR1@10 --output=late-%j.out
        trap 'echo caught USR1 at $SECONDS' USR1
        sleep 100 & wait
        sleep 100 & wait
        echo never
        """))
    number = slurm("sbatch", "--parsable", str(script), cwd=tmp_path).stdout.strip()
    wait_until(lambda: sacct_state(number) == "TIMEOUT", 90, f"job {number} TIMEOUT")
    output = (tmp_path / f"late-{number}.out").read_text()
    assert "caught USR1" in output and "never" not in output, output


def test_unsupported_options_are_refused_by_name(login: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "mail.sh"
    script.write_text("#!/bin/bash\n#SBATCH --mail-user=me@example.com\necho hi\n")
    refused = slurm("sbatch", str(script))
    assert refused.returncode == 1 and "--mail-user" in refused.stderr, refused.stderr
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/bash\necho hi\n")
    assert "--exclusive" in slurm("sbatch", "--exclusive", str(plain)).stderr
    assert "%Z" in slurm("squeue", "-o", "%Z").stderr


def test_squeue_scancel_and_a_cancelled_job(login: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "long.sh"
    script.write_text("#!/bin/bash\n#SBATCH -J long\nsleep 120\n")
    number = slurm("sbatch", "--parsable", str(script), cwd=tmp_path).stdout.strip()
    wait_until(lambda: sacct_state(number) == "RUNNING", 60, "RUNNING")
    rows = slurm("squeue", "--me", "-h", "-o", "%i %j %T").stdout.splitlines()
    assert f"{number} long RUNNING" in rows
    assert slurm("scancel", number).returncode == 0
    wait_until(lambda: sacct_state(number) == "CANCELLED", 30, "CANCELLED")
    assert number not in slurm("squeue", "-h", "-o", "%i").stdout.split()


def test_submitit_runs_unchanged(login: dict[str, str], tmp_path: Path) -> None:
    import slurm_helpers  # type: ignore[import-not-found]
    import submitit  # type: ignore[import-not-found]

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_gres="gpu:1", slurm_additional_parameters={"account": "demo"})
    job = executor.submit(slurm_helpers.multiply, 6, 7)
    assert job.job_id.isdigit()
    product, job_id, task = job.result()
    print(f"submitit function job {job.job_id}: result {product}, SLURM_JOB_ID {job_id}")
    assert (product, job_id, task) == (42, job.job_id, None)
    # The result file comes first; the job ends once its process has exited (Slurm's COMPLETING).
    wait_until(lambda: job.get_info(mode="force").get("State") == "COMPLETED", 30, "COMPLETED")

    jobs = executor.map_array(slurm_helpers.multiply, [1, 2, 3, 4], [10, 10, 10, 10])
    results = [j.result() for j in jobs]
    print(f"submitit map_array {[j.job_id for j in jobs]}: {results}")
    array = jobs[0].job_id.split("_")[0]
    assert [r[0] for r in results] == [10, 20, 30, 40]
    assert [j.job_id for j in jobs] == [f"{array}_{i}" for i in range(4)]
    assert [r[2] for r in results] == ["0", "1", "2", "3"]


def test_submitit_checkpoint_and_requeue_before_the_time_limit(login: dict[str, str], tmp_path: Path) -> None:
    import slurm_helpers  # type: ignore[import-not-found]
    import submitit  # type: ignore[import-not-found]

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    # --time=1 minute with --signal=USR2@40: the signal 20 s into each run, the kill at 60 s;
    # 25 one-second steps take more than one run, and fewer than submitit's 3 requeues allow.
    executor.update_parameters(timeout_min=1, slurm_signal_delay_s=40, slurm_gres="gpu:1",
                               slurm_additional_parameters={"account": "demo"})
    job = executor.submit(slurm_helpers.Counter(), 25)
    done, restarts = job.result()
    log = job.stdout() or ""
    print(f"submitit checkpointed job {job.job_id}: counted {done}, SLURM_RESTART_COUNT {restarts}")
    assert done == 25
    assert int(restarts) >= 1, log
    assert f"Requeued job {job.job_id}" in log, log


def test_scancel_signal_preempts_and_submitit_requeues(login: dict[str, str], tmp_path: Path) -> None:
    """submitit's own preemption test path: `scancel ID --signal SIGTERM`, then `--signal USR2`."""
    import slurm_helpers  # type: ignore[import-not-found]
    import submitit  # type: ignore[import-not-found]

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=30, slurm_gres="gpu:1", slurm_additional_parameters={"account": "demo"})
    job = executor.submit(slurm_helpers.Counter(), 12)
    wait_until(lambda: "Starting with JobEnvironment" in (job.stdout() or "") or job.done(), 60, "the function started")
    time.sleep(3)
    job._interrupt()  # submitit's: scancel ID --signal SIGTERM; scancel ID --signal USR2
    done, restarts = job.result()
    print(f"submitit preempted job {job.job_id}: counted {done}, SLURM_RESTART_COUNT {restarts}")
    assert (done, restarts) == (12, "1")
    assert "this job is preempted" in (job.stderr() or "")


def test_submitit_cancel(login: dict[str, str], tmp_path: Path) -> None:
    import slurm_helpers  # type: ignore[import-not-found]
    import submitit  # type: ignore[import-not-found]

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_gres="gpu:1", slurm_additional_parameters={"account": "demo"})
    job = executor.submit(slurm_helpers.sleep_for, 300)
    wait_until(lambda: job.get_info(mode="force").get("State") == "RUNNING", 60, "the job RUNNING")
    job.cancel()
    state = wait_until(lambda: job.get_info(mode="force").get("State") in ("CANCELLED",) and "CANCELLED", 30, "CANCELLED")
    print(f"submitit cancelled job {job.job_id}: {state}")
    deadline = time.monotonic() + 10
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.done()
