"""The committed generated code of protos/rota/v1 matches a fresh generation byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTOS = REPO / "protos"
GENERATED = PROTOS / "rota" / "v1"


def _generated(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if "_pb2" in p.name and p.suffix in (".py", ".pyi")}


def test_generated_protos_are_fresh(tmp_path: Path) -> None:
    env = dict(os.environ)
    # generate.sh runs `python`: make it the interpreter running the tests.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        ["bash", str(PROTOS / "generate.sh"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    fresh_dir = tmp_path / "rota" / "v1"
    fresh, committed = _generated(fresh_dir), _generated(GENERATED)
    protos = {p.stem for p in GENERATED.glob("*.proto")}
    assert protos and fresh, "nothing was generated"
    # Every .proto yields its messages, its gRPC module and the stubs of both.
    for stem in protos:
        assert {f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py", f"{stem}_pb2_grpc.pyi"} <= fresh
    stale = sorted(
        name for name in fresh | committed
        if name not in fresh or name not in committed
        or (fresh_dir / name).read_bytes() != (GENERATED / name).read_bytes()
    )
    assert not stale, (
        f"stale generated protos (run `bash protos/generate.sh` and commit): {', '.join(stale)}"
    )
