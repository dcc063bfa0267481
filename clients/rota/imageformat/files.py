"""How the image format's files are written, and the markers of a restore folder.

Every file is written to a temporary name and renamed, so a reader sees all of it or
nothing. A restore folder (staged images a starting job loads) is complete once READY is
in it; FAILED, holding the reason, says it never will be.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FAILED", "READY", "write_atomic"]

READY = "READY"  # written into the restore folder once every rank's image is ready to load
FAILED = "FAILED"  # written there instead when materialising failed (with the reason)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
