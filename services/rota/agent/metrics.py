"""The agent's per-GPU gauges, read at scrape time: nvidia-smi on GPU nodes, the process
table on virtual slots (where a "GPU" is a CPU slot, its job's processes are the device).

    rota_gpu_utilization_ratio{node, gpu}   nvidia-smi's utilization.gpu / 100; virtual: the
                                            holder's CPU time per second since the last
                                            scrape, shared over its slots (at most 1)
    rota_gpu_memory_used_bytes{node, gpu}   nvidia-smi's memory.used; virtual: the holder's
                                            resident memory, shared over its slots
    rota_agent_jobs_running{node}           jobs this agent runs now
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily

from rota.agent.gpus import DeviceInfo
from rota.agent.processes import ProcessTable
from rota.common.metrics import REGISTRY, CachedCollector, gauge

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def group_usage(proc: Path = Path("/proc")) -> dict[int, tuple[float, int]]:
    """Process group -> (CPU seconds, resident bytes) summed over its live processes."""
    out: dict[int, tuple[float, int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone between the listing and the read
        # After the command: state(0) ppid(1) pgrp(2) ... utime(11) stime(12) ... rss(21).
        pgrp, cpu, rss = int(fields[2]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[21]) * PAGE
        had_cpu, had_rss = out.get(pgrp, (0.0, 0))
        out[pgrp] = (had_cpu + cpu, had_rss + rss)
    return out


class GpuMetrics:
    def __init__(self, node: str, table: ProcessTable, devices: list[DeviceInfo]) -> None:
        self.node = node
        self.table = table
        self.devices = devices
        self._last: dict[int, tuple[float, float]] = {}  # pgid -> (CPU seconds, monotonic time)

    def read(self) -> list[GaugeMetricFamily]:
        util: dict[int, float] = {d.index: 0.0 for d in self.devices}
        memory: dict[int, float] = {d.index: 0.0 for d in self.devices}
        real = [d for d in self.devices if not d.virtual]
        if real:
            for index, busy, used in _nvidia_smi_usage():
                util[index], memory[index] = busy, used
        else:
            self._virtual(util, memory)
        running = len(self.table.running())
        return [
            gauge("rota_gpu_utilization_ratio", "GPU busy fraction (virtual slots: the holder's CPU share)",
                  ["node", "gpu"], (((self.node, str(g)), v) for g, v in sorted(util.items()))),
            gauge("rota_gpu_memory_used_bytes", "GPU memory in use (virtual slots: the holder's RSS share)",
                  ["node", "gpu"], (((self.node, str(g)), v) for g, v in sorted(memory.items()))),
            gauge("rota_agent_jobs_running", "Jobs this agent runs", ["node"], [((self.node,), float(running))]),
        ]

    def _virtual(self, util: dict[int, float], memory: dict[int, float]) -> None:
        usage = group_usage()
        now = time.monotonic()
        seen: dict[int, tuple[float, float]] = {}
        for job in self.table.running():
            if job.pgid not in usage or not job.gpus:
                continue
            cpu, rss = usage[job.pgid]
            seen[job.pgid] = (cpu, now)
            before = self._last.get(job.pgid)
            share = 0.0
            if before is not None and now > before[1]:
                share = max(0.0, cpu - before[0]) / (now - before[1]) / len(job.gpus)
            for g in job.gpus:
                if g in util:
                    util[g] = min(1.0, share)
                    memory[g] = rss / len(job.gpus)
        self._last = seen


def _nvidia_smi_usage() -> list[tuple[int, float, float]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.strip().splitlines():
        try:
            index, busy, used = (float(p.strip()) for p in line.split(","))
        except ValueError:
            continue  # "[N/A]" on some boards
        rows.append((int(index), busy / 100.0, used * 1024 * 1024))
    return rows


def register_gpu_metrics(node: str, table: ProcessTable, devices: list[DeviceInfo]) -> GpuMetrics:
    source = GpuMetrics(node, table, devices)
    REGISTRY.register(CachedCollector(source.read, ttl_s=1.0))
    return source
