"""A real Slurm on this machine for `rota bench slurm`: munged, slurmctld and slurmd started as
child processes in the foreground (no systemd), all state in one temporary folder that
`stop` removes. Debian's packages (`apt-get install -y slurm-wlm munge`: bench/slurm/run.sh)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from rota.bench.slurm_conf import SlurmLayout, parse_node_states, slurm_conf

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "scontrol", "squeue", "sinfo")


def missing() -> str:
    """Why a local Slurm cannot run here ('' when it can)."""
    absent = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} not found); "
                "bench/slurm/run.sh installs Debian's slurm-wlm and munge with apt-get")
    if os.geteuid() != 0:
        return "slurmd runs jobs as their users and must run as root; run as root"
    return ""


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalSlurm:
    def __init__(self, cpus: int) -> None:
        state = Path(tempfile.mkdtemp(prefix="rota-slurm-"))
        self.layout = SlurmLayout(state=state, host=socket.gethostname().split(".")[0], cpus=cpus,
                                  ctld_port=_free_port(), d_port=_free_port())
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.layout.conf)}

    def start(self, timeout_s: float = 60) -> None:
        lay = self.layout
        for folder in (lay.munge_socket.parent, lay.state / "ctld", lay.state / "slurmd"):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        lay.munge_key.write_bytes(os.urandom(1024))  # this run's own key
        lay.munge_key.chmod(0o600)
        lay.conf.write_text(slurm_conf(lay))
        m = lay.munge_socket.parent
        self._spawn([_binary("munged"), "-F", "--force", f"--socket={lay.munge_socket}", f"--key-file={lay.munge_key}",
                     f"--log-file={m / 'munged.log'}", f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'seed'}"],
                    "munged")
        self._wait(lay.munge_socket.exists, timeout_s, "munged's socket")
        self._spawn([_binary("slurmctld"), "-D", "-f", str(lay.conf)], "slurmctld")
        self._spawn([_binary("slurmd"), "-D", "-f", str(lay.conf)], "slurmd")
        self._wait(lambda: parse_node_states(self.command("sinfo", "-h", "-o", "%T").stdout) == ["idle"], timeout_s,
                   "the node idle in sinfo")

    def _spawn(self, argv: list[str], name: str) -> None:
        log = (self.layout.state / f"{name}.out").open("wb")
        self.processes.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def _wait(self, ready: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():  # type: ignore[operator]
            dead = [str(p.args[0]) for p in self.processes if p.poll() is not None]  # type: ignore[index]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"local Slurm: no {what} ({'exited: ' + ', '.join(dead) if dead else 'timed out'}); "
                                   f"logs: {self.logs()}")
            time.sleep(0.2)

    def command(self, name: str, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([_binary(name), *args], env=self.env, capture_output=True, text=True, timeout=timeout_s)

    def logs(self) -> str:
        tails = []
        for path in sorted(self.layout.state.rglob("*.log")) + sorted(self.layout.state.glob("*.out")):
            lines = path.read_text(errors="replace").splitlines()[-5:]
            tails.append(f"{path.name}: " + " | ".join(lines))
        return "; ".join(tails)

    def stop(self) -> None:
        """Cancels every job, stops the daemons (SIGTERM, then SIGKILL) and removes the state folder."""
        if any(p.poll() is None for p in self.processes):
            try:
                self.command("scancel", "--full", "--user=root", timeout_s=10)
            except (OSError, subprocess.SubprocessError):
                pass
        for process in reversed(self.processes):  # slurmd, slurmctld, then munged
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=15)
        shutil.rmtree(self.layout.state, ignore_errors=True)
