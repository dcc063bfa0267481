#!/usr/bin/env bash
# Protobuf checks (called by .ci/run): `buf lint` (STANDARD) and `buf breaking` (WIRE_JSON)
# of the rota.v1 module, configured by protos/buf.yaml.
#   buf is installed once from the npm registry into .ci/cache/buf (git-ignored), pinned;
#   a later run with it there needs no network.
#   breaking compares the working tree's protos/ with those of BUF_AGAINST_REF (default
#   HEAD~1, the previous commit: a fresh clone has it; a shallow one with no parent skips
#   the comparison and says so). The rules are this tree's protos/buf.yaml, so a previous
#   commit without a buf.yaml compares the same way.
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=1.75.0
prefix=.ci/cache/buf
buf="$prefix/node_modules/.bin/buf"

if [[ ! -x "$buf" ]] || [[ "$("$buf" --version 2>/dev/null)" != "$BUF_VERSION" ]]; then
  echo "buf: installing @bufbuild/buf@$BUF_VERSION from npm into $prefix"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  # --ignore-scripts: the package's bin shim finds the platform binary itself.
  if ! npm install --prefix "$prefix" --prefer-offline --ignore-scripts --no-audit --no-fund \
      --loglevel=error "@bufbuild/buf@$BUF_VERSION"; then
    if command -v buf >/dev/null 2>&1 && [[ "$(buf --version)" == "$BUF_VERSION" ]]; then
      buf="$(command -v buf)"
      echo "buf: npm install failed; using $buf"
    else
      echo "buf: npm install of @bufbuild/buf@$BUF_VERSION failed and no buf $BUF_VERSION on PATH" >&2
      exit 1
    fi
  fi
fi
echo "buf $("$buf" --version)"

echo "buf lint protos"
"$buf" lint protos
echo "buf lint: ok"

ref="${BUF_AGAINST_REF:-HEAD~1}"
if ! git rev-parse --verify -q "$ref^{commit}" >/dev/null; then
  echo "buf breaking: skipped, no commit $ref to compare with (shallow clone or first commit)"
  exit 0
fi
against=".git#ref=$ref,subdir=protos"
echo "buf breaking protos --against '$against'  ($ref = $(git rev-parse --short "$ref"))"
"$buf" breaking protos --against "$against"
echo "buf breaking: ok"
