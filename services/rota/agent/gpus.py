"""GPU discovery: real devices through nvidia-smi when present, else virtual CPU slots.

Each device carries its type, the short name jobs ask for (`gpu_types: [a100]`): read from
nvidia-smi's model name on a GPU node, declared (--gpu-type) on virtual slots.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from rota.core.nodelabels import MAX_TYPE_LENGTH

# Words of a model name that say who made or sells it, not which chip it is.
_BRANDS = {"nvidia", "tesla", "geforce", "quadro"}
# Families whose number is a word of its own: "RTX 4090", "GTX 1080 Ti", "TITAN V".
_FAMILIES = {"rtx", "gtx", "titan"}
_SUFFIXES = {"ti", "super", "ada"}  # "RTX 3090 Ti", "RTX 6000 Ada Generation"
_WORKSTATION = re.compile(r"^[a-z]\d+$")  # "RTX A6000": the A6000 is the name


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    uuid: str
    model: str
    virtual: bool
    gpu_type: str = ""


def gpu_type_of(model: str) -> str:
    """nvidia-smi's model name -> its short type: "NVIDIA H100 80GB HBM3" -> "h100",
    "Tesla V100-SXM2-16GB" -> "v100", "NVIDIA GeForce RTX 4090" -> "rtx4090"; "" when
    nothing is left of it. Memory size and form factor are dropped: one type a chip."""
    words = [w for w in model.lower().split() if w not in _BRANDS]
    if not words:
        return ""
    first, rest = words[0].split("-")[0], words[1:]
    if first in _FAMILIES and rest:
        model_word = rest[0].split("-")[0]
        if _WORKSTATION.match(model_word):
            first = model_word
        else:
            first += model_word
            first += "".join(w for w in rest[1:2] if w in _SUFFIXES)
    return re.sub(r"[^a-z0-9._-]", "", first)[:MAX_TYPE_LENGTH]


def discover(node: str, virtual_count: int | None, gpu_type: str = "") -> list[DeviceInfo]:
    """`virtual_count` (from --gpus K) forces K virtual slots of type `gpu_type`; otherwise
    ask nvidia-smi, and a declared `gpu_type` overrides what the model names say."""
    if virtual_count is None:
        real = _nvidia_smi()
        if real:
            return [DeviceInfo(d.index, d.uuid, d.model, False, gpu_type or d.gpu_type) for d in real]
        virtual_count = 1
    return [DeviceInfo(i, f"virtual-{node}-{i}", "virtual (CPU)", True, gpu_type) for i in range(virtual_count)]


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
        devices.append(DeviceInfo(int(index), uuid, name, False, gpu_type_of(name)))
    return devices
