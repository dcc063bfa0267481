"""The pure core loads no I/O library at run time (import-linter checks the static graph in CI).

Every module under `rota.core` is imported in a fresh interpreter, the lazily imported
CP-SAT policy included, and the interpreter's modules are then searched for I/O libraries.
"""

from __future__ import annotations

import subprocess
import sys

# OR-Tools loads google.protobuf itself, so protobuf is not on the list; rota.v1 (our protos) is
# caught by the last check, which admits no rota module outside the core.
IO_LIBRARIES = {"grpc", "sqlalchemy", "psycopg", "redis", "alembic", "torch", "matplotlib"}


def test_every_core_module_imports_without_io_libraries() -> None:
    code = (
        "import pkgutil, sys, importlib, rota.core as core\n"
        "for m in pkgutil.walk_packages(core.__path__, 'rota.core.'): importlib.import_module(m.name)\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(m for m in sys.modules if m.startswith('rota.core.')))\n"
        f"print(sorted(loaded & set({sorted(IO_LIBRARIES)!r})))\n"
        "print(sorted({m for m in sys.modules if m.startswith('rota.') and not m.startswith('rota.core')}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules, io_loaded, other_rota = out.strip().splitlines()
    assert "rota.core.planning.policy_full" in modules and "rota.core.detection.failslow" in modules
    assert io_loaded == "[]"
    assert other_rota == "[]"


def test_the_sdk_and_the_runtime_load_no_torch_and_no_server_library() -> None:
    # Jobs bring their own torch (CPU or CUDA): the runtime imports it inside the calls that need it.
    code = (
        "import sys, rota.client, rota.runtime\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'sqlalchemy', 'psycopg', 'ortools',"
        " 'matplotlib', 'redis'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_kv_cache_window_stays_pure_outside_the_core() -> None:
    # CONCUR's window left rota.core for the job kit (it runs inside jobs, beside the engine) but is
    # still plain logic: it loads no torch, no numpy, no I/O library and no other rota module.
    code = (
        "import sys, rota.jobkit.inference.kv_window\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'grpc', 'sqlalchemy', 'redis'}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('rota.') and m != 'rota.jobkit.inference.kv_window'"
        " and m not in ('rota.jobkit', 'rota.jobkit.inference')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines() == ["[]", "[]"]
