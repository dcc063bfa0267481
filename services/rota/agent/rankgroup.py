"""One node's rank group of a gang: the job's command once per local rank, torchrun-style.

The agent runs this (through the launcher) for a job that spans nodes. It starts the
command `--ranks` times with RANK and LOCAL_RANK set (the agent has set MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, NODE_RANK, GROUP_RANK and LOCAL_WORLD_SIZE), waits for them,
and exits with the first failure: when one rank fails, the others of this node are
stopped at once (the control plane then stops the other nodes' groups), as torchrun's
agent does for its workers. Progress is node rank 0's local rank 0 report; the other
ranks write their own files beside it.

Like the launcher it imports only the standard library and runs without site-packages.

    python -I -S rankgroup.py --ranks M -- COMMAND...
"""

from __future__ import annotations

import os
import signal
import sys
import time

GRACE_S = 5.0  # after one rank failed, how long the others get between SIGTERM and SIGKILL
USAGE = "usage: rota-rankgroup --ranks M -- COMMAND..."


def parse(argv: list[str]) -> tuple[int, list[str]]:
    if len(argv) < 4 or argv[0] != "--ranks" or argv[2] != "--":
        raise SystemExit(USAGE)
    try:
        ranks = int(argv[1])
    except ValueError:
        raise SystemExit(f"{USAGE}\n--ranks: not an integer") from None
    if ranks < 1:
        raise SystemExit(f"{USAGE}\n--ranks: at least 1")
    return ranks, argv[3:]


def rank_env(base: dict[str, str], local_rank: int) -> dict[str, str]:
    env = dict(base)
    per_node = int(env.get("LOCAL_WORLD_SIZE", "1"))
    node_rank = int(env.get("NODE_RANK", "0"))
    env["LOCAL_RANK"] = str(local_rank)
    env["RANK"] = str(node_rank * per_node + local_rank)
    env["ROLE_RANK"] = env["RANK"]
    if local_rank and "ROTA_PROGRESS_FILE" in env:  # one voice per gang: node 0, local rank 0
        env["ROTA_PROGRESS_FILE"] = f"{env['ROTA_PROGRESS_FILE']}.rank{env['RANK']}"
    return env


def main(argv: list[str] | None = None) -> int:
    ranks, command = parse(sys.argv[1:] if argv is None else argv)
    children: dict[int, int] = {}  # pid -> local rank
    for local_rank in range(ranks):
        try:
            pid = os.posix_spawnp(command[0], command, rank_env(dict(os.environ), local_rank))
        except OSError as exc:
            print(f"rota: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
            _stop(children)
            return 127
        children[pid] = local_rank
    terminated: list[int] = []

    def on_term(_sig: int, _frame: object) -> None:  # stopped by the agent: stop every rank
        terminated.append(128 + signal.SIGTERM)
        _stop(children)

    signal.signal(signal.SIGTERM, on_term)
    failed = 0
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid not in children:
            continue
        rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        code = code if code >= 0 else 128 - code
        if code and not failed:
            failed = code
            print(f"rota: local rank {rank} exited with {code}; stopping the other ranks", file=sys.stderr, flush=True)
            _stop(children)
    return failed or (terminated[0] if terminated else 0)


def _stop(children: dict[int, int]) -> None:
    for pid in children:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while children and time.monotonic() < deadline:
        for pid in list(children):
            if os.waitpid(pid, os.WNOHANG)[0]:
                children.pop(pid)
        time.sleep(0.05)
    for pid in children:
        _kill(pid, signal.SIGKILL)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main())
