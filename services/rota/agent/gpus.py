"""GPU discovery: real devices through nvidia-smi when present, else virtual CPU slots."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    uuid: str
    model: str
    virtual: bool


def discover(node: str, virtual_count: int | None) -> list[DeviceInfo]:
    """`virtual_count` (from --gpus K) forces K virtual slots; otherwise ask nvidia-smi."""
    if virtual_count is None:
        real = _nvidia_smi()
        if real:
            return real
        virtual_count = 1
    return [DeviceInfo(i, f"virtual-{node}-{i}", "virtual (CPU)", True) for i in range(virtual_count)]


def _nvidia_smi() -> list[DeviceInfo]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,uuid,name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    devices = []
    for line in out.strip().splitlines():
        index, uuid, name = (part.strip() for part in line.split(",", 2))
        devices.append(DeviceInfo(int(index), uuid, name, False))
    return devices
