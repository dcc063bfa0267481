"""One node's replicas of a realtime app: the app's command once per GPU, each its own process.

The agent runs this (through the launcher) for a realtime app. It watches the replicas
file (`ROTA_REPLICAS_FILE`, which the agent rewrites atomically under a newer epoch at
every resize) and keeps one process per GPU listed: a resize starts the new GPUs'
replicas and stops (SIGTERM, then SIGKILL after GRACE_S) the removed ones', and the
replicas that stay run on untouched. Only once the removed replicas are gone does it
write the applied file (`<replicas file>.applied`, {"epoch", "gpus"}): the agent waits
for it before it answers the resize, so a GPU's old replica never runs beside what is
placed there next. A replica process gets ROTA_REPLICA_GPU (its GPU), ROTA_REPLICA_INDEX
(the lowest index no other replica here has), ROTA_GPUS and CUDA_VISIBLE_DEVICES of that
GPU alone ("" on virtual slots, where the agent set it empty) and a progress file of its
own; this process writes the node's progress: the replicas' last reports with `served`
summed (over the replicas it has stopped too) and `replicas` the count running.

A replica that exits 0 is done (not started again); the first that fails stops the others
and this exits with its code, as a rank group does. Standard library only, run without
site-packages.

    python -I -S replicaset.py -- COMMAND...
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

POLL_S = 0.2
GRACE_S = 5.0
USAGE = "usage: rota-replicaset -- COMMAND..."


class ReplicaSet:
    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.command, self.env = command, env
        self.path = env["ROTA_REPLICAS_FILE"]
        self.progress = env.get("ROTA_PROGRESS_FILE", "")
        self.virtual = env.get("CUDA_VISIBLE_DEVICES", "") == ""
        self.children: dict[int, tuple[int, int]] = {}  # GPU -> (pid, replica index)
        self.done: set[int] = set()  # GPUs whose replica exited 0
        self.applied: tuple[int, tuple[int, ...]] | None = None
        self.served_before = 0.0  # `served` last reported by replicas since stopped
        self.last_line = ""

    def wanted(self) -> tuple[int, tuple[int, ...]] | None:
        try:
            with open(self.path) as f:
                data = json.load(f)
            return int(data["epoch"]), tuple(sorted(int(g) for g in data["gpus"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # being replaced, or not written yet: read again next tick

    def apply(self, epoch: int, gpus: tuple[int, ...]) -> None:
        self.stop([g for g in self.children if g not in gpus])
        self.done &= set(gpus)
        for gpu in gpus:
            if gpu not in self.children and gpu not in self.done:
                self.spawn(gpu)
        self.applied = (epoch, gpus)
        _write_atomic(self.path + ".applied", json.dumps({"epoch": epoch, "gpus": list(gpus)}))

    def spawn(self, gpu: int) -> None:
        used = {index for _, index in self.children.values()}
        index = next(i for i in range(len(used) + 1) if i not in used)
        env = dict(self.env)
        env.update({"ROTA_REPLICA_GPU": str(gpu), "ROTA_REPLICA_INDEX": str(index), "ROTA_GPUS": str(gpu),
                    "CUDA_VISIBLE_DEVICES": "" if self.virtual else str(gpu)})
        if self.progress:  # a fresh file: what a stopped replica here served is counted already
            env["ROTA_PROGRESS_FILE"] = self.replica_progress(gpu)
            open(env["ROTA_PROGRESS_FILE"], "w").close()
        self.children[gpu] = (os.posix_spawnp(self.command[0], self.command, env), index)

    def replica_progress(self, gpu: int) -> str:
        return f"{self.progress}.replica{gpu}"

    def stop(self, gpus: list[int]) -> None:
        """The replicas of `gpus` stopped and reaped; their last `served` kept in the sum."""
        pids = {self.children.pop(g)[0]: g for g in gpus if g in self.children}
        for pid in pids:
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while pids and time.monotonic() < deadline:
            for pid in [p for p in pids if _reaped(p)]:
                pids.pop(pid)
            time.sleep(0.05)
        for pid in pids:
            _kill(pid, signal.SIGKILL)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        for gpu in gpus:
            self.served_before += _served(self.report_of(gpu))

    def reap(self) -> int:
        """Replicas that exited on their own: 0, or the first failure's exit code."""
        for gpu, (pid, _) in list(self.children.items()):
            got, status = os.waitpid(pid, os.WNOHANG)
            if not got:
                continue
            del self.children[gpu]
            code = os.waitstatus_to_exitcode(status)
            code = code if code >= 0 else 128 - code
            if code:
                print(f"rota: the replica on GPU {gpu} exited with {code}; stopping the others", file=sys.stderr, flush=True)
                return code
            self.done.add(gpu)
        return 0

    def report_of(self, gpu: int) -> dict[str, object]:
        line = last_line(self.replica_progress(gpu)) if self.progress else ""
        try:
            value = json.loads(line) if line else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def write_progress(self) -> None:
        if not self.progress:
            return
        reports = [self.report_of(g) for g in sorted(self.children)]
        if not any(reports):
            return  # nothing reported yet: no line the agent would read as the app's
        merged: dict[str, object] = {}
        for r in reversed(reports):  # the lowest GPU's values win
            merged.update(r)
        if any("served" in r for r in reports) or self.served_before:
            total = self.served_before + sum(_served(r) for r in reports)
            merged["served"] = int(total) if total == int(total) else total
        merged["replicas"] = len(self.children)
        line = json.dumps(merged, separators=(",", ":"))
        if line != self.last_line:
            with open(self.progress, "a") as f:
                f.write(line + "\n")
            self.last_line = line


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "--":
        raise SystemExit(USAGE)
    env = dict(os.environ)
    if "ROTA_REPLICAS_FILE" not in env:
        raise SystemExit(f"{USAGE}\nROTA_REPLICAS_FILE is not set")
    group = ReplicaSet(args[1:], env)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stopping.append(128 + signal.SIGTERM))
    failed = 0
    while not stopping and not failed:
        wanted = group.wanted()
        if wanted is not None and wanted != group.applied:
            try:
                group.apply(*wanted)
            except OSError as exc:
                print(f"rota: cannot start {args[1]!r}: {exc}", file=sys.stderr, flush=True)
                failed = 127
                break
        failed = group.reap()
        group.write_progress()
        if not group.children and group.done:
            break  # every replica finished on its own
        time.sleep(POLL_S)
    group.stop(list(group.children))
    return failed or (stopping[0] if stopping else 0)


def _served(report: dict[str, object]) -> float:
    value = report.get("served")
    return float(value) if isinstance(value, int | float) else 0.0


def _reaped(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def last_line(path: str, max_bytes: int = 65536) -> str:
    """The last complete, non-blank line of a file ('' if none): a progress report being
    written is not read half-way. Shared with the agent (rota.agent.processes)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line for line in data.split("\n")[:-1] if line.strip()]
    return lines[-1] if lines else ""


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
