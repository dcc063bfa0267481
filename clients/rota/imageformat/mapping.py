"""Zero-copy restore: a segment of an image, as one contiguous span of memory made of its
chunk files mapped in place, so tensors are views of the files' pages and nothing copies
the bytes on the way in.

A segment of the staged format starts at a page-aligned offset and its chunks are cut
every `chunk_size` bytes (a multiple of the page size), so each chunk file maps at a page
boundary of the span: the span is reserved as one anonymous mapping, then every chunk file
is mapped over its part (MAP_FIXED | MAP_PRIVATE), lazily: a page is mapped when it is first
touched, and MADV_WILLNEED starts the kernel's read-ahead of the files meanwhile (a no-op for
pages already in the page cache). Prefaulting with MAP_POPULATE (`ROTA_MAP_POPULATE=1`, as
before) is no prefetch here: on a writable private mapping the kernel populates with write
faults, which break copy-on-write and copy every page. The mappings are private: a job writing into a restored tensor (an optimizer's step) copies
only the pages it touches and never writes the store's files. Chunks are immutable (a
content-addressed name, written once by a rename), and a collector deleting one only
unlinks it: a mapping keeps its bytes readable. The span is freed (one munmap of all of
it) when the last tensor viewing it is.

Only Linux has the calls; elsewhere `available()` is False and the reader copies instead.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from typing import Any

PAGE = mmap.PAGESIZE
_MAP_FIXED = 0x10
_MAP_POPULATE = 0x08000  # Linux: fault the pages in at mmap time (on a private mapping: copied)
_MADV_WILLNEED = 3
ENV_POPULATE = "ROTA_MAP_POPULATE"  # 1: prefault (and so copy) every page at map time, as before
_libc: Any = None


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(mmap, "MAP_PRIVATE") and _mmap_call() is not None


def _mmap_call() -> Any:
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.madvise.restype = ctypes.c_int
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _libc = libc
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


def map_chunks(chunks: list[tuple[str, int]], populate: bool | None = None) -> mmap.mmap:
    """One writable (copy-on-write) span holding the chunk files back to back. Every chunk
    but the last must be a whole number of pages long. `populate` (default: ROTA_MAP_POPULATE)
    prefaults every page; otherwise pages map on first touch, read ahead meanwhile."""
    if populate is None:
        populate = os.environ.get(ENV_POPULATE, "0") == "1"
    total = sum(size for _, size in chunks)
    span = mmap.mmap(-1, max(PAGE, total), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE)
    anchor = ctypes.c_char.from_buffer(span)  # the span's address; released before return
    base = ctypes.addressof(anchor)
    del anchor
    libc = _mmap_call()
    flags = mmap.MAP_PRIVATE | _MAP_FIXED | (_MAP_POPULATE if populate else 0)
    at = 0
    try:
        for i, (path, size) in enumerate(chunks):
            if size == 0:
                continue
            if at % PAGE:
                raise ValueError(f"chunk {i} of a segment starts at {at}, not at a page boundary")
            fd = os.open(path, os.O_RDONLY)
            try:
                if os.fstat(fd).st_size < size:
                    raise ValueError(f"chunk {path} is shorter than its manifest says")
                got = libc.mmap(base + at, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
                if got is None or got == ctypes.c_void_p(-1).value or got != base + at:
                    err = ctypes.get_errno()
                    raise OSError(err, f"mmap of {path}: {os.strerror(err)}")
            finally:
                os.close(fd)  # the mapping keeps the file
            at += size
        if not populate and total:
            libc.madvise(base, total, _MADV_WILLNEED)  # advice only: a failure changes nothing
    except BaseException:
        span.close()
        raise
    return span
