"""The scripted-user phases of `rota bench load`: `--cli` and `--array N`.

`--cli`: as a Slurm user's `for ...; do sbatch ...; done`, T closed loops (spread over P
client processes, 16 over 2 by default) each run `rota submit FILE --json` as a new
process for S seconds; submissions per second, latency percentiles, and the CLI's CPU per
call (user + system time of the finished `rota` processes, from RUSAGE_CHILDREN, over the
calls): what each call costs the submitting machine.

`--array N`: one array of N jobs through the SDK's `submit_array`: one RPC, one commit;
the time to accept it and the jobs per second that makes.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from rota.bench.fault_harness import TENANT, Harness, percentiles

CLI_JOB = {"name": "cli-load", "tenant": TENANT, "kind": "training", "priority": 1, "gpus": 1,
           "command": ["sleep", "1"], "restart": "never"}


def _ms(values: list[float]) -> dict[str, float]:
    return {k: round(v * 1000, 1) if k != "n" else v for k, v in percentiles(values).items()}


def _cli_client(argv: list[str], env: dict[str, str], threads: int, start_at: float,
                stop_at: float) -> tuple[list[float], float, int]:
    """One client process: `threads` loops of the CLI; (latencies, children's CPU seconds, failures)."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    failures = [0] * threads
    before = resource.getrusage(resource.RUSAGE_CHILDREN)

    def loop(k: int) -> None:
        time.sleep(max(0.0, start_at - time.time()))
        while time.time() < stop_at:
            t0 = time.perf_counter()
            done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            if done.returncode == 0:
                latencies[k].append(time.perf_counter() - t0)
            else:
                failures[k] += 1

    pool = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return [x for per in latencies for x in per], cpu, sum(failures)


def precompile() -> str:
    """Writes the bytecode of Rota's own modules, as `pip install .` does at install time.
    An editable install otherwise compiles them on every call wherever PYTHONDONTWRITEBYTECODE
    is set (these machines set it): about 0.08 s of CPU per `rota` call, measured here."""
    import compileall
    import importlib

    # `rota` is a namespace package over clients/, core/, services/ and protos/: one module
    # of each says where its folder is.
    for name in ("rota.client", "rota.core", "rota.v1", "rota.common"):
        module = importlib.import_module(name)
        compileall.compile_dir(Path(str(module.__file__)).parent.parent, quiet=1)
    return "precompiled"


def cli(h: Harness, seconds: float, threads: int, processes: int, work: Path, *, grpc_only: bool = False) -> dict[str, Any]:
    """The loops; `rota submit` takes the api's HTTP gateway as a user's would (the cluster
    folder names it), or, with `grpc_only`, the gRPC client (ROTA_HTTP_ENDPOINT=none): the
    baseline of the same run."""
    bytecode = precompile()
    job_file = work / "cli-load.yaml"
    job_file.write_text(yaml.safe_dump(CLI_JOB))
    rota = str(Path(sys.executable).with_name("rota"))
    argv = [rota, "submit", str(job_file), "--json"] if os.path.exists(rota) else \
        [sys.executable, "-m", "rota.cli.main", "submit", str(job_file), "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROTA_")}
    env.update(ROTA_HOME=str(h.home), ROTA_TOKEN=h.token)
    if grpc_only:
        env["ROTA_HTTP_ENDPOINT"] = "none"
    parts = max(1, min(processes, threads))
    shares = [threads // parts + (1 if k < threads % parts else 0) for k in range(parts)]
    with ProcessPoolExecutor(parts, mp_context=multiprocessing.get_context("spawn")) as pool:
        start_at = time.time() + 1.0
        stop_at = start_at + seconds
        results = [f.result() for f in [pool.submit(_cli_client, argv, env, n, start_at, stop_at) for n in shares]]
        elapsed = time.time() - start_at
    latencies = [x for lat, _cpu, _f in results for x in lat]
    cpu = sum(c for _lat, c, _f in results)
    calls = len(latencies) + sum(f for _lat, _c, f in results)
    return {"threads": threads, "processes": parts, "submissions": len(latencies),
            "failed": calls - len(latencies), "per_second": round(len(latencies) / elapsed, 1),
            "latency_ms": _ms(latencies), "cpu_ms_per_call": round(cpu / max(1, calls) * 1000, 1), "bytecode": bytecode,
            "transport": "grpc" if grpc_only else "http",
            "command": " ".join(["rota", "submit", job_file.name, "--json"])}


def array(h: Harness, jobs: int) -> dict[str, Any]:
    from rota.client import job_spec_from_mapping

    spec = job_spec_from_mapping(dict(CLI_JOB, name="array-load"), base_dir=Path.cwd())
    with h.client() as client:
        t0 = time.perf_counter()
        submitted = client.submit_array(spec=spec, indices=range(jobs))
        took = time.perf_counter() - t0
        client.cancel_array(submitted.id, reason="load benchmark over")
    return {"jobs": len(submitted.job_ids), "submit_s": round(took, 3), "per_second": round(jobs / took, 1)}
