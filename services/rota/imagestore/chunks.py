"""The content-addressed chunk store: a directory every agent can reach (ROTA_HOME/chunks).

A chunk is stored once under its SHA-256, so the same bytes written by four data-parallel
ranks, or by two successive checkpoints of a tensor that did not change, take the space
of one. Writes are a temporary file plus a rename: a reader sees a whole chunk or none,
and two writers of the same chunk (necessarily the same bytes) cannot collide.

`ChunkStore` is the interface; an object store (S3 and the like) implements the same
operations: conditional put, get, list with modification times, delete. The one subtle
operation is `retire`, the garbage collector's delete that must lose every race against a
writer reusing the chunk: a writer refreshes the chunk's mtime (or writes it again when it
is gone), and `retire` moves the chunk aside, re-reads its mtime there, and puts it back
when a writer touched it after the cutoff.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

HASH = "sha256"
MIB = 1 << 20
# 4 MiB: see bench/checkpoint/README.md ("Chunk size"): from 1 MiB up, hashing and writing
# run at full speed, while smaller chunks find the same duplicates across ranks (tensors
# are aligned to segments) and keep an unchanged tensor's chunks reusable.
DEFAULT_CHUNK_SIZE = 4 * MIB


@dataclass(frozen=True)
class StoredChunk:
    digest: str
    size: int
    mtime: float


class ChunkStore(Protocol):
    def put(self, digest: str, data: memoryview | bytes) -> bool:
        """Stores the chunk unless present (then refreshes its mtime). True when written."""
        ...

    def read_into(self, digest: str, view: memoryview) -> None: ...

    def has(self, digest: str) -> bool: ...

    def local_path(self, digest: str) -> Path | None:
        """A file this machine can read the chunk from, if the store has one (a restore then
        reads it in place); None for a remote store."""
        ...

    def chunks(self) -> Iterator[StoredChunk]: ...

    def retire(self, digest: str, cutoff: float) -> bool:
        """Deletes the chunk unless it was written or touched at or after `cutoff` (unix s)."""
        ...

    def put_manifest(self, image_id: str, data: bytes) -> None: ...

    def get_manifest(self, image_id: str) -> bytes: ...

    def delete_manifest(self, image_id: str) -> None: ...


class FileChunkStore:
    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = root
        self.fsync = fsync
        for sub in ("chunks", "manifests", "trash"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a {HASH} digest: {digest!r}")
        return self.root / "chunks" / digest[:2] / digest

    def put(self, digest: str, data: memoryview | bytes) -> bool:
        path = self.path(digest)
        try:
            os.utime(path)  # present: refresh it, so a collector running now keeps it
            return False
        except FileNotFoundError:
            pass
        path.parent.mkdir(exist_ok=True)
        self._write(path, data)
        return True

    def _write(self, path: Path, data: memoryview | bytes) -> None:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def read_into(self, digest: str, view: memoryview) -> None:
        with open(self.path(digest), "rb", buffering=0) as f:
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    raise ValueError(f"chunk {digest} is shorter than its manifest says ({got} < {len(view)} bytes)")
                got += n

    def has(self, digest: str) -> bool:
        return self.path(digest).exists()

    def local_path(self, digest: str) -> Path | None:
        path = self.path(digest)
        return path if path.exists() else None

    def chunks(self) -> Iterator[StoredChunk]:
        for sub in sorted((self.root / "chunks").iterdir()):
            for entry in os.scandir(sub):
                if entry.name.startswith("."):
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                yield StoredChunk(entry.name, st.st_size, st.st_mtime)

    def retire(self, digest: str, cutoff: float) -> bool:
        path = self.path(digest)
        trash = self.root / "trash" / f"{digest}.{secrets.token_hex(4)}"
        try:
            os.replace(path, trash)
        except FileNotFoundError:
            return False
        # A writer that touched the chunk before the move shows in its mtime: put it back.
        # One that comes after the move finds no chunk and writes it again itself.
        if trash.stat().st_mtime >= cutoff:
            os.replace(trash, path)
            return False
        trash.unlink()
        return True

    def put_manifest(self, image_id: str, data: bytes) -> None:
        self._write(self._manifest(image_id), data)

    def get_manifest(self, image_id: str) -> bytes:
        return self._manifest(image_id).read_bytes()

    def delete_manifest(self, image_id: str) -> None:
        self._manifest(image_id).unlink(missing_ok=True)

    def _manifest(self, image_id: str) -> Path:
        if not image_id or "/" in image_id or image_id.startswith("."):
            raise ValueError(f"bad image id {image_id!r}")
        return self.root / "manifests" / f"{image_id}.json"

    def clean_trash(self, older_than_s: float = 3600.0) -> None:
        """Leftovers of a collector that died between its move and its decision."""
        cutoff = time.time() - older_than_s
        for entry in os.scandir(self.root / "trash"):
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
            except FileNotFoundError:
                continue
