#!/usr/bin/env bash
# Regenerates the committed Python modules and type stubs of protos/rota/v1/*.proto.
# tests/unit/test_protos_fresh.py runs the same generation and fails when they are stale.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
python -m grpc_tools.protoc -I "$here" \
  --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" --mypy_grpc_out="$out" \
  "$here"/rota/v1/*.proto
