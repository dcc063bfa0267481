"""The names of a local cluster's processes, apart from the code that starts them: the CLI's
parser lists them (`rota serve SERVICE`) without importing the local cluster's machinery."""

from __future__ import annotations

SERVICES = ("api", "allocator", "forecaster", "ledger", "checkpoint", "detector")
# The web console: a client of the api over HTTP, not a gRPC service (not in cluster.json's "services").
CONSOLE = "console"
