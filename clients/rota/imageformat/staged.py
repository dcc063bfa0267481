"""One rank's state as a staged image: a raw blob of tensor bytes plus a JSON index.

This is the format a job's runtime and its node agent exchange through local files (a
tmpfs under /dev/shm when there is one), in both directions: a checkpoint or pause is
staged by the job and turned into chunks by the agent; for a restore the agent points
each rank's index at the chunks' files (or copies them into a blob when the store is
remote) and the job loads from there.

    rank-<r>.bin    segments, each starting at a 4 KiB-aligned offset
    rank-<r>.json   {"rank", "world_size", "step", "size", "segments": [[offset, length]],
                     "tensors": [{"dtype", "shape", "offset", "nbytes"}], "skeleton": k}

Every tensor of the state is a segment of its own (large tensors are the bulk of the
bytes, and giving each its own segment keeps its chunks identical from one checkpoint to
the next when it did not change); tensors under PACK_LIMIT share packed segments, so a
model's many small biases do not each become a chunk. Packs never mix the state's
top-level entries (model, optimizer, RNG, ...): a model replicated across data-parallel
ranks then packs into the same bytes on every rank, even though each rank's RNG differs. Everything that is not a tensor
(RNG states, step, data cursor, optimizer hyper-parameters, extra values) is one pickle,
the "skeleton", in which each tensor is replaced by its index (pickle's persistent ids).
Only registered tensors are written: never an allocator's reserved-but-unused memory.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import pickle
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rota.imageformat import mapping

ENV_ZERO_COPY = "ROTA_ZERO_COPY"  # 0: a restore copies every tensor out of the chunk files (as before)
ALIGN = 4096
PACK_LIMIT = 1 << 20  # tensors smaller than this share a packed segment
PACK_TARGET = 4 << 20  # a packed segment is closed once it holds this much
FORMAT_VERSION = 1


def blob_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.bin"


def index_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.json"


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Pickler(pickle.Pickler):
    """Replaces every tensor by its index. In a shared entry (identical on every rank), the
    k-th tensor is written by rank k % world only, and named ("s", k) everywhere."""

    def __init__(self, file: io.BytesIO, tensors: list[Any], rank: int, world: int) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors
        self.rank, self.world = rank, world
        self.seen: dict[int, tuple[str, int]] = {}
        self.sharing = False
        self.shared: dict[int, int] = {}  # shared index k -> local tensor index (owned ones)
        self.shared_count = 0
        self.skipped_bytes = 0  # shared tensors other ranks write
        torch = sys.modules.get("torch")  # a state holds tensors only once torch is imported
        self.tensor_type: Any = torch.Tensor if torch is not None else _NoTensor

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, self.tensor_type):
            return None
        if obj.is_sparse or obj.is_quantized:
            raise ValueError("sparse and quantized tensors cannot be checkpointed by rota.runtime")
        key = id(obj)
        if key in self.seen:  # a tensor named twice (tied weights) is written once
            return self.seen[key]
        if self.sharing:
            k = self.shared_count
            self.shared_count += 1
            if k % self.world == self.rank:
                self.shared[k] = len(self.tensors)
                self.tensors.append(obj)
            else:
                self.skipped_bytes += obj.numel() * obj.element_size()
            pid: tuple[str, int] = ("s", k)
        else:
            pid = ("t", len(self.tensors))
            self.tensors.append(obj)
        self.seen[key] = pid
        return pid


class _NoTensor:
    """Stands for torch.Tensor in a process that never imported torch: nothing is one."""


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[Any], shared: Any) -> None:
        super().__init__(file)
        self.tensors = tensors
        self.shared = shared  # k -> the shared tensor k (from whichever rank wrote it)

    def persistent_load(self, pid: Any) -> Any:
        kind, index = pid
        if kind == "t":
            return self.tensors[index]
        if kind == "s":
            return self.shared(index)
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


@dataclass
class Layout:
    """Where each tensor and the skeleton go in the blob."""

    size: int = 0
    segments: list[list[int]] = field(default_factory=list)
    tensors: list[dict[str, Any]] = field(default_factory=list)
    skeleton: int = -1


def plan_layout(tensors: list[Any], skeleton_bytes: int, groups: list[int] | None = None) -> Layout:
    """`groups[i]` is tensor i's top-level entry: a pack holds tensors of one group only."""
    layout = Layout()
    pack_start, pack_used, pack_group = -1, 0, -1

    def new_segment(length: int) -> int:
        offset = _align(layout.size)
        layout.segments.append([offset, length])
        layout.size = offset + length
        return offset

    for i, t in enumerate(tensors):
        group = groups[i] if groups is not None else 0
        nbytes = t.numel() * t.element_size()
        entry = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "nbytes": nbytes}
        if nbytes >= PACK_LIMIT:
            entry["offset"] = new_segment(nbytes)
            pack_start = -1
        else:
            if pack_start < 0 or pack_used + nbytes > PACK_TARGET or group != pack_group:
                pack_start, pack_used, pack_group = new_segment(0), 0, group
            # Packed tensors are 64-byte aligned inside their segment (any dtype's alignment).
            offset = pack_start + _align64(pack_used)
            pack_used = _align64(pack_used) + nbytes
            layout.segments[-1][1] = pack_used
            layout.size = pack_start + pack_used
            entry["offset"] = offset
        layout.tensors.append(entry)
    layout.skeleton = len(layout.segments)
    new_segment(skeleton_bytes)
    return layout


def _align64(n: int) -> int:
    return (n + 63) // 64 * 64


def stage(folder: Path, rank: int, world_size: int, step: int, state: dict[str, Any],
          shared: frozenset[str] = frozenset()) -> tuple[int, float]:
    """Writes `state` (a dict of picklable structures holding tensors) as rank `rank`'s image.

    Entries named in `shared` are identical on every rank (data-parallel replicas): their
    tensors are split across the ranks, each rank copying a 1/world share, so a pause copies
    the replicated state once in all instead of once per rank. Returns (the bytes of state
    this rank stands for, shares written by others included; seconds taken). The index is
    written last, with a rename, so a reader that sees it sees a complete blob.
    """
    started = time.perf_counter()
    tensors: list[Any] = []
    groups: list[int] = []
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, tensors, rank, world_size)
    pickler.dump(list(state))
    for group, (key, value) in enumerate(state.items()):
        pickler.sharing = key in shared
        pickler.dump(value)  # one pickle per entry, sharing the memo: tensors keep one index
        groups += [group] * (len(tensors) - len(groups))
    skeleton = buffer.getvalue()
    layout = plan_layout(tensors, len(skeleton), groups)
    folder.mkdir(parents=True, exist_ok=True)
    path = blob_path(folder, rank)
    offset, length = layout.segments[layout.skeleton]
    with open(path, "wb") as f:
        f.truncate(layout.size)
        f.seek(offset)
        f.write(skeleton)
    if any(entry["nbytes"] for entry in layout.tensors):
        _copy_tensors(path, layout, tensors)
    logical = sum(e["nbytes"] for e in layout.tensors) + len(skeleton) + pickler.skipped_bytes
    index = {
        "version": FORMAT_VERSION, "rank": rank, "world_size": world_size, "step": step, "size": layout.size,
        "segments": layout.segments, "tensors": layout.tensors, "skeleton": layout.skeleton,
        "shared": {str(k): i for k, i in pickler.shared.items()}, "logical_bytes": logical,
    }
    tmp = index_path(folder, rank).with_suffix(".tmp")
    tmp.write_text(json.dumps(index))
    os.replace(tmp, index_path(folder, rank))
    return logical, time.perf_counter() - started


def _copy_tensors(path: Path, layout: Layout, tensors: list[Any]) -> None:
    """Each tensor's bytes to its place in the blob, with pwrite: the kernel copies into
    the tmpfs pages it allocates in bulk, about twice as fast here as copying into a fresh
    shared mapping, which faults each page in one at a time. A host tensor is written from
    its own memory; a device tensor is copied to the host first, piece by piece, through one
    pinned buffer kept for the process's next checkpoint or pause (`_host_buffer`)."""
    import torch

    fd = os.open(path, os.O_RDWR)
    try:
        for t, entry in zip(tensors, layout.tensors, strict=True):
            if not entry["nbytes"]:
                continue
            src = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
            if src.device.type == "cpu":
                _pwrite_all(fd, memoryview(src.numpy()), int(entry["offset"]))
            else:
                copy_through_buffer(fd, src, int(entry["offset"]))
    finally:
        os.close(fd)


def _pwrite_all(fd: int, view: memoryview, at: int) -> None:
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


_BUFFER: list[Any] = []  # the process's pinned host buffer, reused from one copy to the next
BUFFER_BYTES = 64 << 20


def _host_buffer() -> Any:
    import torch

    if not _BUFFER:
        pin = torch.cuda.is_available()  # page-locked: the device copies into it at full speed
        _BUFFER.append(torch.empty(BUFFER_BYTES, dtype=torch.uint8, pin_memory=pin))
    return _BUFFER[0]


def copy_through_buffer(fd: int, src: Any, at: int) -> None:
    """A (device) uint8 tensor's bytes to the file at `at`, BUFFER_BYTES at a time through
    the reused host buffer."""
    buffer = _host_buffer()
    host = memoryview(buffer.numpy())
    for start in range(0, src.numel(), BUFFER_BYTES):
        n = min(BUFFER_BYTES, src.numel() - start)
        buffer[:n].copy_(src[start: start + n])  # synchronous: the bytes are there on return
        _pwrite_all(fd, host[:n], at + start)


def read_index(folder: Path, rank: int) -> dict[str, Any]:
    index: dict[str, Any] = json.loads(index_path(folder, rank).read_text())
    if index.get("version") != FORMAT_VERSION:
        raise ValueError(f"staged image format {index.get('version')} is not {FORMAT_VERSION}")
    return index


def load(folder: Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reads rank `rank`'s image: (its index, the state as staged), tensors on the CPU.
    Shared tensors written by other ranks are read from their parts of the same image.

    A rank's bytes come from its blob in `folder` or, when its index names them
    ("sources": per segment, [path, length] of each chunk), straight from the chunk
    store's files: the agent then copies nothing, and neither does this (zero-copy,
    `rota.imageformat.mapping`): each segment's chunk files are mapped in place, privately,
    into one span, and its tensors are views of it; rota.runtime assigns them to a module's
    parameters in place and an optimizer keeps its moments as they are mapped (pages of the
    page cache, mapped on first touch, until a step writes them). A blob (a remote store's
    chunks copied to a tmpfs) is mapped privately and each tensor copied out once instead,
    so no tensor pins the tmpfs file's memory.
    """
    readers = _Readers(folder)
    index, reader = readers.get(rank)
    tensors = [reader.tensor(entry) for entry in index["tensors"]]

    def shared(k: int) -> Any:
        owner_index, owner = readers.get(k % int(index["world_size"]))
        return owner.tensor(owner_index["tensors"][owner_index["shared"][str(k)]])

    offset, length = index["segments"][index["skeleton"]]
    skeleton = reader.raw(offset, length) if length else b""
    unpickler = _Unpickler(io.BytesIO(skeleton), tensors, shared)
    keys = unpickler.load()
    state = {key: unpickler.load() for key in keys}
    return index, state


def uses_other_ranks(index: dict[str, Any]) -> bool:
    """Whether other ranks read this rank's part on restore (a share of replicated state)."""
    return bool(index.get("shared"))


class _Readers:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.open: dict[int, tuple[dict[str, Any], _Reader]] = {}

    def get(self, rank: int) -> tuple[dict[str, Any], _Reader]:
        if rank not in self.open:
            index = read_index(self.folder, rank)
            self.open[rank] = (index, _Reader(self.folder, rank, index))
        return self.open[rank]


class _Reader:
    """Byte ranges of one rank's state, from its blob or from its chunks' files."""

    def __init__(self, folder: Path, rank: int, index: dict[str, Any]) -> None:
        self.sources: list[tuple[int, list[list[Any]]]] | None = None
        self.path = blob_path(folder, rank)
        self.size = int(index["size"])
        self._blob: Any = None
        self._spans: dict[int, Any] = {}  # segment start -> its chunks mapped in place, as a uint8 tensor
        self.zero_copy = mapping.available() and os.environ.get(ENV_ZERO_COPY, "1") != "0"
        if "sources" in index:
            self.sources = sorted((int(o), chunks) for (o, _), chunks in zip(index["segments"], index["sources"],
                                                                          strict=True))
            self.starts = [o for o, _ in self.sources]

    def tensor(self, entry: dict[str, Any]) -> Any:
        import torch

        dtype = getattr(torch, entry["dtype"])
        if not entry["nbytes"]:
            return torch.empty(entry["shape"], dtype=dtype)
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        if self.sources is not None and self.zero_copy:
            start, span = self._span(offset)
            data = span[offset - start: offset - start + nbytes]
        else:
            data = self.read(offset, nbytes)
        return data.view(dtype).reshape(entry["shape"])

    def _span(self, offset: int) -> tuple[int, Any]:
        """(start, bytes) of the segment holding `offset`, its chunk files mapped in place."""
        import warnings

        import torch

        assert self.sources is not None
        start, chunks = self.sources[bisect.bisect_right(self.starts, offset) - 1]
        if start not in self._spans:
            span = mapping.map_chunks([(str(p), int(n)) for p, n in chunks])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "non-writable buffer": the span is writable (copy-on-write)
                self._spans[start] = torch.frombuffer(span, dtype=torch.uint8, count=sum(int(n) for _, n in chunks))
        return start, self._spans[start]

    def _pieces(self, offset: int, length: int) -> list[tuple[str, int, int, int]]:
        """(file, its size, start in it, start in the range) for each chunk the range spans."""
        assert self.sources is not None
        segment_start, chunks = self.sources[bisect.bisect_right(self.starts, offset) - 1]
        at, out = segment_start, []
        for path, size in chunks:  # the chunks of the segment overlapping the range
            lo, hi = max(at, offset), min(at + size, offset + length)
            if lo < hi:
                out.append((str(path), int(size), lo - at, lo - offset))
            at += size
            if at >= offset + length:
                break
        return out

    def raw(self, offset: int, length: int) -> bytes:
        """The bytes [offset, offset + length) with plain reads: the skeleton, no torch needed."""
        if self.sources is None:
            with open(self.path, "rb") as f:
                f.seek(offset)
                return f.read(length)
        out = bytearray(length)
        for path, _size, start, at in self._pieces(offset, length):
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(length - at)
            out[at: at + len(data)] = data[: length - at]
        return bytes(out)

    def read(self, offset: int, length: int) -> Any:
        """A new uint8 tensor holding the bytes [offset, offset + length)."""
        import torch

        if self.sources is None:
            if self._blob is None:
                self._blob = torch.from_file(str(self.path), shared=False, size=self.size, dtype=torch.uint8)
            return self._blob[offset: offset + length].clone()
        out = torch.empty(length, dtype=torch.uint8)
        for path, size, start, at in self._pieces(offset, length):
            chunk = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
            n = min(size - start, length - at)
            out[at: at + n].copy_(chunk[start: start + n])
        return out
