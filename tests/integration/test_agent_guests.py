"""A trial as a guest in a host job's bubbles, on the agent with real processes: it shares
the host's GPUs without stopping it, runs at idle priority, is listed in the host's guests
file, resumes when the host ends, stops promptly even while stopped, and is adopted."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import test_agent_processes as agent_tests
from test_agent_processes import SLEEP, Tables, launch, wait_exit, wait_until

from rota.agent.processes import GUESTS_FILE, LocalJob, ProcessTable

PY = sys.executable
# Counts forever, one line a tick: a guest whose progress shows whether it runs.
COUNTER = [PY, "-c", "import itertools, time\nfor i in itertools.count():\n    print(i, flush=True); time.sleep(0.02)"]


# The same process-table fixtures as the process-table tests.
tables = agent_tests.tables
table = agent_tests.table


def group(pgid: int) -> list[int]:
    """The live processes of a process group."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def states(pgid: int) -> set[str]:
    out = set()
    for pid in group(pgid):
        try:
            out.add(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass
    return out


def guests_listed(host: LocalJob) -> list[int]:
    path = host.folder / GUESTS_FILE
    return list(json.loads(path.read_text())["pgids"]) if path.exists() else []


def lines(job: LocalJob) -> int:
    return len(job.log_path.read_text().splitlines()) if job.log_path.exists() else 0


def test_a_guest_shares_its_hosts_gpus_at_idle_priority_and_is_listed_for_the_host(table: ProcessTable) -> None:
    host = launch(table, "j-host", 10, [0, 1], SLEEP)
    guest = table.launch("j-trial", 11, [0], COUNTER, "", {}, True, guest_of="j-host")
    assert wait_until(lambda: lines(guest) > 3)
    assert host.exit_code() is None  # a guest does not take the GPUs from its host
    assert guests_listed(host) == [guest.pgid]
    pids = group(guest.pgid)
    assert pids and all(os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in pids)
    assert all(os.sched_getscheduler(pid) != os.SCHED_IDLE for pid in group(host.pgid))
    env = Path(f"/proc/{max(pids)}/environ").read_bytes().split(b"\0")
    assert b"ROTA_GUEST_OF=j-host" in env
    # Any other job placed on those GPUs still takes them (the old holder is stopped).
    other = launch(table, "j-other", 12, [1], SLEEP)
    assert wait_exit(host) != 0 and other.exit_code() is None


def test_a_guest_left_stopped_by_its_host_resumes_when_the_host_ends(table: ProcessTable) -> None:
    host = launch(table, "j-host2", 20, [0], [PY, "-c", "import time; time.sleep(1.5)"])
    guest = table.launch("j-trial2", 21, [0], COUNTER, "", {}, True, guest_of="j-host2")
    assert wait_until(lambda: lines(guest) > 3)
    os.killpg(guest.pgid, signal.SIGSTOP)  # as the host's stage does at a compute start
    assert wait_until(lambda: states(guest.pgid) == {"T"})
    table.tend_guests()
    assert states(guest.pgid) == {"T"}  # while its host runs, the host decides
    assert wait_exit(host) == 0
    table.tend_guests()
    assert wait_until(lambda: "T" not in states(guest.pgid))
    before = lines(guest)
    assert wait_until(lambda: lines(guest) > before + 3) and guest.released
    table.tend_guests()  # the host's file no longer lists a guest that left it
    assert guests_listed(host) == [] or host.exit_code() is not None


def test_a_stopped_guest_stops_within_its_grace_and_leaves_the_hosts_list(table: ProcessTable) -> None:
    host = launch(table, "j-host3", 30, [0], SLEEP)
    guest = table.launch("j-trial3", 31, [0], COUNTER, "", {}, True, guest_of="j-host3")
    assert wait_until(lambda: lines(guest) > 1)
    os.killpg(guest.pgid, signal.SIGSTOP)
    assert table.stop("j-trial3", 31, "cancelled", grace_s=5)
    assert wait_exit(guest, 2) == 143  # SIGTERM reached it: it was resumed, not killed
    assert guests_listed(host) == [] and host.exit_code() is None


def test_a_restarted_agent_adopts_a_guest_as_a_guest(tables: Tables) -> None:
    first = tables.new()
    launch(first, "j-host4", 40, [0], SLEEP)
    guest = first.launch("j-trial4", 41, [0], COUNTER, "", {}, True, guest_of="j-host4")
    second = tables.new()
    second.adopt()
    adopted = second.jobs["j-trial4"]
    assert (adopted.guest_of, adopted.pgid, adopted.exit_code()) == ("j-host4", guest.pgid, None)
