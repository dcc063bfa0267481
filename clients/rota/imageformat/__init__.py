"""The checkpoint image format: one rank's state as a staged image (a blob of tensor bytes and
a JSON index, `staged`), its zero-copy reader over the store's chunk files (`mapping`), and
how its files are written and a restore folder is marked ready (`files`).

The job runtime writes and loads it; the node agent, the image store and the checkpoint
service read and rebuild it. It imports nothing else of Rota and loads torch only inside
the calls that need it.
"""

from rota.imageformat.staged import (
    BUFFER_BYTES,
    ENV_ZERO_COPY,
    FORMAT_VERSION,
    blob_path,
    copy_through_buffer,
    index_path,
    load,
    read_index,
    stage,
    uses_other_ranks,
)

__all__ = [
    "BUFFER_BYTES", "ENV_ZERO_COPY", "FORMAT_VERSION", "blob_path", "copy_through_buffer", "index_path", "load",
    "read_index", "stage", "uses_other_ranks",
]
