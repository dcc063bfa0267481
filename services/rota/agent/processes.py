"""The agent's table of job processes, kept on disk so a restarted agent adopts them.

Each launch gets a folder `jobs/<job>-<epoch>/` with `meta.json`, `log`, `progress.jsonl`
and, once the job ended, `exit` (written by the launcher). Fencing is per resource: a
command older than what this agent already runs for the same job or GPUs is refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rota.agent import cgroups as cgroups_module
from rota.agent import launcher as launcher_module
from rota.agent import rankgroup as rankgroup_module
from rota.agent import replicaset as replicaset_module
from rota.agent.warm_runtime import WarmPool
from rota.core.errors import FailedPrecondition
from rota.core.quantities import format_limit

ERROR_TAIL_LINES = 20
REPLICAS_FILE = "replicas.json"
# A host job's guests (trials in its pipeline bubbles): their process groups, which its
# stage stops outside its bubbles (rota.runtime.bubble_guests reads the file).
GUESTS_FILE = "guests.json"
# Written by the agent before it lets a paused job exit: the exit then reads as PAUSED.
PAUSED_MARKER = "paused"
# The launcher runs as a file, isolated (-I) and without site-packages (-S): it needs only
# the standard library, and skipping the venv's site set-up (editable-install finders
# included) is part of why a job start costs the node about 20 ms of CPU, not 90.
LAUNCHER = (sys.executable, "-I", "-S", str(Path(launcher_module.__file__).resolve()))
RANKGROUP = (sys.executable, "-I", "-S", str(Path(rankgroup_module.__file__).resolve()))
REPLICASET = (sys.executable, "-I", "-S", str(Path(replicaset_module.__file__).resolve()))
# A resize waits this long for the replica set to have stopped the replicas it removes.
RESIZE_APPLY_S = replicaset_module.GRACE_S + 5.0


@dataclass(frozen=True)
class GangLaunch:
    """This node's part of a gang: its node rank, and where the gang's ranks meet."""

    nodes: tuple[str, ...]
    node_rank: int
    ranks_per_node: int
    master_addr: str
    master_port: int

    def env(self) -> dict[str, str]:
        """torchrun's variables for the whole group; RANK and LOCAL_RANK are per rank (rankgroup)."""
        return {
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(len(self.nodes) * self.ranks_per_node), "NODE_RANK": str(self.node_rank),
            "GROUP_RANK": str(self.node_rank), "LOCAL_WORLD_SIZE": str(self.ranks_per_node),
            "NNODES": str(len(self.nodes)), "ROTA_GANG_NODES": ",".join(self.nodes),
        }


@dataclass
class LocalJob:
    job_id: str
    epoch: int
    gpus: list[int]
    pgid: int
    folder: Path
    popen: subprocess.Popen[bytes] | None = None
    stopped_reason: str = ""
    started_at: float = 0.0  # monotonic time of the launch by this agent process
    replicas: bool = False  # a realtime app's replica set: one process per GPU (rota.agent.replicaset)
    guest_of: str = ""  # a trial in this host job's bubbles, on its GPUs
    released: bool = False  # a guest whose host ended here: resumed (SIGCONT) and left to run
    cgroup: cgroups_module.JobCgroup | None = None  # its own cgroup: limits, and the kernel's OOM kills
    time_limit_s: float | None = None  # stopped once it has run this long (wall clock)
    started_wall: float = 0.0  # time.time() of the launch: a restarted agent keeps counting
    @property
    def log_path(self) -> Path:
        return self.folder / "log"

    def exit_code(self) -> int | None:
        exit_file = self.folder / "exit"
        if exit_file.exists():
            return int(exit_file.read_text().split()[0])
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return None
            return code if code >= 0 else 128 - code
        if _group_alive(self.pgid):
            return None
        return 255  # adopted after a restart, gone without an exit record

    def state(self) -> str:
        return self.state_for(self.exit_code())

    def state_for(self, code: int | None) -> str:
        """The state that goes with one read of the exit code. A report reads the code once
        and derives the state from it: the process may exit between two reads, and a
        report must not pair a running job's code (0) with a finished job's FAILED."""
        if code is None:
            return "RUNNING"
        if (self.folder / PAUSED_MARKER).exists():
            return "PAUSED"
        return "SUCCEEDED" if code == 0 and not self.stopped_reason else "FAILED"

    def progress_json(self) -> str:
        return replicaset_module.last_line(str(self.folder / "progress.jsonl"))

    def error(self) -> str:
        if self.stopped_reason:
            return self.stopped_reason
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            lines = []
        tail = "\n".join(lines[-ERROR_TAIL_LINES:])
        if self.cgroup is not None and self.exit_code() not in (None, 0) and self.cgroup.oom_killed():
            return f"{cgroups_module.oom_reason(self.cgroup.memory_bytes)}\n{tail}".rstrip()  # first line: the reason
        return tail

    def past_time_limit(self, now: float) -> bool:
        return self.time_limit_s is not None and now - self.started_wall > self.time_limit_s


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class ProcessTable:
    def __init__(self, node: str, home: Path, lease_file: Path, lease_timeout_s: float,
                 cgroups: cgroups_module.NodeCgroups | str = "not set up") -> None:
        self.node = node
        # The node's cgroups, or why there are none: jobs with limits are then refused.
        self.cgroups = cgroups
        self.home = home
        self.lease_file = lease_file
        self.lease_timeout_s = lease_timeout_s
        self.jobs: dict[str, LocalJob] = {}
        self.max_epoch = 0
        (home / "jobs").mkdir(parents=True, exist_ok=True)
        self.warm: WarmPool | None = None  # a pre-started interpreter handed the next job

    def start_warm_runtime(self, idle: bool = True, refill: bool = True) -> WarmPool:
        """Keeps a warm runtime ready for the next job (rota.agent.warm_runtime)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
        self.warm = WarmPool(env, idle=idle, refill=refill)
        self.warm.start()
        return self.warm

    # 1. Adoption after a restart.
    def lease_expired(self) -> bool:
        """Whether the lease lapsed while no agent renewed it (read before renewing it)."""
        try:
            return time.time() - self.lease_file.stat().st_mtime > self.lease_timeout_s
        except FileNotFoundError:
            return False  # never held: nothing was launched under it

    def adopt(self, *, fence: bool = False) -> None:
        """Takes over the jobs a previous agent process launched. With `fence` (its lease
        lapsed) they are stopped, not adopted: their launchers were due to stop them, and
        renewing the lease first would let a copy the control plane has already given up
        run beside its replacement (a gang's rank on another node, say)."""
        for meta_file in sorted((self.home / "jobs").glob("*/meta.json")):
            meta = json.loads(meta_file.read_text())
            if (meta_file.parent / "acknowledged").exists():
                continue
            job = LocalJob(meta["job_id"], meta["epoch"], meta["gpus"], meta["pgid"], meta_file.parent,
                           replicas=bool(meta.get("replicas")), guest_of=str(meta.get("guest_of", "")),
                           cgroup=cgroups_module.JobCgroup.from_meta(meta["cgroup"]) if meta.get("cgroup") else None,
                           time_limit_s=meta.get("time_limit_s"), started_wall=float(meta.get("started_wall", 0.0)))
            current = self.jobs.get(job.job_id)
            if current is None or current.epoch < job.epoch:
                self.jobs[job.job_id] = job
            self.max_epoch = max(self.max_epoch, job.epoch)
        if fence:
            for job in self.running():
                job.stopped_reason = "fenced: the agent's lease lapsed while it was down"
                _signal_group(job.pgid, signal.SIGKILL)

    # 2. Launch, with per-job and per-GPU fencing.
    def launch(
        self, job_id: str, epoch: int, gpus: list[int], command: list[str], workdir: str,
        env: dict[str, str], virtual: bool, restore_dir: Path | None = None, layout: str = "",
        gang: GangLaunch | None = None, replicas: bool = False, guest_of: str = "",
        limits: cgroups_module.Limits | None = None, time_limit_s: float | None = None,
    ) -> LocalJob:
        """Starts the job under `epoch`; `replicas`: a realtime app, one process per GPU;
        `guest_of`: a trial in that host job's bubbles, on its GPUs, at idle priority;
        `limits`: its cgroup's (a job asking for limits this node cannot enforce is refused:
        it ends FAILED at once with the reason)."""
        current = self._supersede(job_id, epoch)
        if current is not None:
            return current
        self._take_gpus(job_id, epoch, gpus, guest_of)
        folder = self.home / "jobs" / f"{job_id}-{epoch}"
        if (folder / "exit").exists():
            raise FailedPrecondition(f"{job_id} already ran under epoch {epoch}")
        folder.mkdir(parents=True, exist_ok=True)
        cgroup, refusal = self._cgroup(f"{job_id}-{epoch}", limits or cgroups_module.Limits())
        full_env = self._job_env(job_id, epoch, gpus, env, virtual, folder)
        full_env.update(_launch_env(guest_of, restore_dir, layout))
        if gang is not None:  # one rank per GPU of this node, started by the rank group
            full_env.update(gang.env())
            command = [*RANKGROUP, "--ranks", str(gang.ranks_per_node), "--", *command]
        elif replicas:  # one process per replica, each on its own GPU
            command = [*REPLICASET, "--", *command]
        write_replicas(folder, epoch, gpus)
        cwd = workdir if workdir and Path(workdir).is_dir() else str(self.home)
        launcher = [
            *LAUNCHER, "--exit-file", str(folder / "exit"),
            "--lease-file", str(self.lease_file), "--lease-timeout", str(self.lease_timeout_s),
            *(["--sched", "idle"] if guest_of else []),
            *(["--cgroup", ",".join(cgroup.procs_files())] if cgroup is not None else []), "--", *command,
        ]
        if refusal:  # never started: the exit says so, as a launcher's would
            launcher_module.write_exit(str(folder / "exit"), launcher_module.CGROUP_EXIT, "refused")
            launcher = ["true"]
        # The warm runtime takes plain jobs; a gang, replicas or a job in its own cgroup start cold.
        warm = self.warm is not None and gang is None and not replicas and cgroup is None and not refusal
        popen = self.warm.launch(launcher[len(LAUNCHER):], command, full_env, cwd, folder / "log") \
            if warm and self.warm is not None else None
        if popen is None:
            with (folder / "log").open("ab") as log:
                popen = subprocess.Popen(
                    launcher, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )
        job = LocalJob(job_id, epoch, gpus, popen.pid, folder, popen, started_at=time.monotonic(), replicas=replicas,
                       guest_of=guest_of, stopped_reason=refusal, cgroup=cgroup, time_limit_s=time_limit_s,
                       started_wall=time.time())
        meta = {"job_id": job_id, "epoch": epoch, "gpus": gpus, "pgid": popen.pid, **({"replicas": True} if replicas else {}),
                **({"guest_of": guest_of} if guest_of else {}),
                **({"cgroup": cgroup.to_meta()} if cgroup is not None else {}),
                **({"time_limit_s": time_limit_s, "started_wall": job.started_wall} if time_limit_s is not None else {})}
        (folder / "meta.json").write_text(json.dumps(meta))
        self.jobs[job_id] = job
        self.max_epoch = max(self.max_epoch, epoch)
        if guest_of:
            self.tend_guests()
        return job

    def _cgroup(self, name: str, limits: cgroups_module.Limits) -> tuple[cgroups_module.JobCgroup | None, str]:
        """(the launch's cgroup, "") where this node has cgroups; (None, why the job is
        refused) when it asks for limits the node cannot enforce; (None, "") otherwise."""
        if isinstance(self.cgroups, str):
            if not limits.needs_cgroup:
                return None, ""
            return None, f"refused: this node cannot enforce cpus or memory limits (cgroups: {self.cgroups})"
        try:
            return self.cgroups.create(name, limits), ""
        except OSError as exc:
            return None, f"refused: cannot make the job's cgroup ({exc})"

    def past_time_limits(self, now: float) -> list[tuple[LocalJob, str]]:
        """The running jobs past their time limit, each with the reason it is stopped for."""
        return [(job, f"time limit {format_limit(job.time_limit_s or 0)} reached") for job in self.running()
                if job.past_time_limit(now) and not job.stopped_reason]

    def _supersede(self, job_id: str, epoch: int) -> LocalJob | None:
        """The job itself if it already runs under `epoch`; an older epoch of it is stopped, a
        newer one refuses the launch."""
        current = self.jobs.get(job_id)
        if current is None:
            return None
        if current.epoch > epoch:
            raise FailedPrecondition(f"stale epoch {epoch} for {job_id}: this node runs epoch {current.epoch}")
        if current.epoch == epoch:
            return current
        self.stop(job_id, current.epoch, "superseded by a newer placement", grace_s=5)
        return None

    def _take_gpus(self, job_id: str, epoch: int, gpus: list[int], guest_of: str) -> None:
        """Per-GPU fencing: other jobs running on `gpus` under an older epoch give them up."""
        for other in list(self.jobs.values()):
            if other.job_id in (job_id, guest_of) or other.guest_of == job_id:
                continue  # a guest shares its host's GPUs by design
            if other.state() != "RUNNING" or not set(other.gpus) & set(gpus):
                continue
            if other.epoch > epoch:
                raise FailedPrecondition(f"stale epoch {epoch}: GPUs {gpus} are held by {other.job_id} (epoch {other.epoch})")
            keep = [g for g in other.gpus if g not in gpus]
            if other.replicas and keep:  # an app's resize not yet here: only those replicas go
                self._apply_replicas(other, other.epoch, keep)
            else:
                self.stop(other.job_id, other.epoch, f"GPUs reassigned at epoch {epoch}", grace_s=5)

    def _job_env(
        self, job_id: str, epoch: int, gpus: list[int], env: dict[str, str], virtual: bool, folder: Path
    ) -> dict[str, str]:
        # The control plane's own secrets (tokens, database URLs) never reach a job.
        base = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
        base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
        base.update(env)
        base.update({
            "ROTA_JOB_ID": job_id,
            "ROTA_NODE": self.node,
            "ROTA_EPOCH": str(epoch),
            "ROTA_GPUS": ",".join(str(g) for g in gpus),
            "ROTA_PROGRESS_FILE": str(folder / "progress.jsonl"),
            "ROTA_REPLICAS_FILE": str(folder / REPLICAS_FILE),
            "ROTA_ITERATIONS_FILE": str(folder / "iterations.jsonl"),  # rota.runtime.report_iteration -> detector
            "ROTA_CONTROL_DIR": str(folder / "control"),  # checkpoint requests (rota.runtime)
            "ROTA_BUBBLE_GUESTS_FILE": str(folder / GUESTS_FILE),  # trials to squeeze into its bubbles
            # Virtual slots run on the CPU: hide any real device from the job.
            "CUDA_VISIBLE_DEVICES": "" if virtual else ",".join(str(g) for g in gpus),
            "PYTHONUNBUFFERED": "1",
        })
        return base

    # 3. Resize a running realtime app in place: a new GPU set under a newer epoch.
    def resize(self, job_id: str, epoch: int, gpus: list[int]) -> LocalJob:
        job = self.jobs.get(job_id)
        if job is None or job.exit_code() is not None:
            raise FailedPrecondition(f"{job_id} is not running on {self.node}")
        if job.epoch > epoch:
            raise FailedPrecondition(f"stale epoch {epoch} for {job_id}: this node runs epoch {job.epoch}")
        if job.epoch == epoch:
            return job
        for other in self.jobs.values():
            if other.job_id != job_id and other.state() == "RUNNING" and set(other.gpus) & set(gpus):
                raise FailedPrecondition(f"GPUs {sorted(set(other.gpus) & set(gpus))} are held by {other.job_id}")
        self._apply_replicas(job, epoch, list(gpus))
        self.max_epoch = max(self.max_epoch, epoch)
        return job

    def _apply_replicas(self, job: LocalJob, epoch: int, gpus: list[int]) -> None:
        """The app's new replica set here; for a replica set, once the replicas it removes
        have stopped (or RESIZE_APPLY_S passed), so what is placed on their GPUs next never
        runs beside them. The replicas that stay run on."""
        job.epoch, job.gpus = epoch, list(gpus)
        write_replicas(job.folder, epoch, gpus)
        meta = json.loads((job.folder / "meta.json").read_text())
        _write_atomic(job.folder / "meta.json", json.dumps({**meta, "epoch": epoch, "gpus": gpus}))
        deadline = time.monotonic() + RESIZE_APPLY_S
        while job.replicas and job.exit_code() is None and time.monotonic() < deadline:
            if applied_replicas(job.folder) == (epoch, sorted(gpus)):
                return
            time.sleep(0.05)

    # 4. Stop: the whole process group, SIGTERM then SIGKILL.
    def stop(self, job_id: str, epoch: int, reason: str, grace_s: float, *, verdict: bool = False) -> bool:
        """`verdict`: `reason` is what the job ends with as it stands (a time limit), not
        `stopped: <reason>`."""
        job = self.jobs.get(job_id)
        if job is None:
            return False
        if epoch and job.epoch > epoch:
            raise FailedPrecondition(f"stale epoch {epoch} for {job_id}: this node runs epoch {job.epoch}")
        if job.exit_code() is None:
            if job.guest_of and not job.released:  # its host must stop pausing it
                job.released = True
                self.tend_guests()
            job.stopped_reason = reason if verdict else f"stopped: {reason}"
            _signal_group(job.pgid, signal.SIGTERM)
            _signal_group(job.pgid, signal.SIGCONT)  # a guest stopped outside its host's bubbles
            deadline = time.monotonic() + grace_s
            while job.exit_code() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            _signal_group(job.pgid, signal.SIGKILL)
            if job.popen is not None:
                job.popen.wait(timeout=10)
        return True

    def stop_all(self, reason: str, grace_s: float) -> None:
        for job in list(self.jobs.values()):
            self.stop(job.job_id, 0, reason, grace_s)

    # 5. Guests: each host's file lists its running guests; a guest whose host ended is
    #    resumed (the host's stage may have left it stopped) and runs on as the GPUs' holder.
    def tend_guests(self) -> None:
        running = self.running()
        by_host: dict[str, list[int]] = {}
        for job in running:
            if not job.guest_of:
                continue
            host = self.jobs.get(job.guest_of)
            if host is not None and host.exit_code() is None and not job.released:
                by_host.setdefault(host.job_id, []).append(job.pgid)
            elif not job.released:
                job.released = True
                _signal_group(job.pgid, signal.SIGCONT)
        for host in running:
            if host.guest_of:
                continue
            path = host.folder / GUESTS_FILE
            wanted = json.dumps({"pgids": sorted(by_host.get(host.job_id, []))})
            if by_host.get(host.job_id) or path.exists():
                try:
                    if path.read_text() == wanted:
                        continue
                except FileNotFoundError:
                    pass
                _write_atomic(path, wanted)

    # 6. Reports for the heartbeat; finished ones are dropped once acknowledged.
    def running(self) -> list[LocalJob]:
        return [j for j in self.jobs.values() if j.exit_code() is None]

    def acknowledge_finished(self, reported: list[LocalJob]) -> None:
        for job in reported:
            if job.exit_code() is not None:
                (job.folder / "acknowledged").touch()
                if job.cgroup is not None:  # read (OOM) and reported: its cgroup goes
                    job.cgroup.remove()
                if self.jobs.get(job.job_id) is job:
                    del self.jobs[job.job_id]

    def remove_cgroups(self) -> None:
        """Every cgroup of a job that has ended, then the node's own when empty (the
        cluster stopping: its jobs were stopped)."""
        for job in self.jobs.values():
            if job.cgroup is not None and job.exit_code() is not None:
                job.cgroup.remove()
        if not isinstance(self.cgroups, str):
            self.cgroups.release()

    def find_log(self, job_id: str) -> Path | None:
        job = self.jobs.get(job_id)
        if job is not None:
            return job.log_path
        folders = sorted((self.home / "jobs").glob(f"{job_id}-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
        return folders[-1] / "log" if folders else None


def write_replicas(folder: Path, epoch: int, gpus: list[int]) -> None:
    """What a realtime app serves on now; replaced atomically so a reader never sees half."""
    _write_atomic(folder / REPLICAS_FILE, json.dumps({"epoch": epoch, "gpus": gpus, "replicas": len(gpus)}))


def applied_replicas(folder: Path) -> tuple[int, list[int]] | None:
    """The (epoch, GPUs) a replica set last applied (rota.agent.replicaset), or None."""
    try:
        data = json.loads((folder / f"{REPLICAS_FILE}.applied").read_text())
        return int(data["epoch"]), sorted(int(g) for g in data["gpus"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    if pgid <= 0:  # never this process's own group
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _launch_env(guest_of: str, restore_dir: Path | None, layout: str) -> dict[str, str]:
    """What a launch adds to the job's environment beyond every job's."""
    env: dict[str, str] = {}
    if guest_of:
        env["ROTA_GUEST_OF"] = guest_of
    if restore_dir is not None:
        env["ROTA_RESTORE_DIR"] = str(restore_dir)
    if layout:  # the 3-D layout an applied re-plan gave the job (rota.runtime.layout())
        env["ROTA_LAYOUT"] = layout
    return env
