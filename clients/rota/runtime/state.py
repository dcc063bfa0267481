"""Checkpointing from inside a job: register the state once, call a safe point every iteration.

    ckpt = rota.runtime.Checkpointer(model=model, optimizer=opt, scheduler=sched, data=gen)
    start = ckpt.restore()                  # 0 on a fresh start; the step to continue after
    for step in range(start + 1, steps + 1):
        ...one iteration...
        ckpt.safe_point(step, cursor=...)   # serves the agent's checkpoint and pause requests

Registered objects are anything with ``state_dict()``/``load_state_dict()`` (modules,
optimizers, LR schedulers) and ``torch.Generator``s; the RNG states of Python, NumPy and
torch (CPU and CUDA) are always taken (NumPy's and torch's once the job imported them: a job
with no tensors need not import torch to be pausable); ``ckpt.extra`` holds any other
picklable values.
``replicated=("model", "optimizer")`` declares objects identical on every rank (data
parallel): each rank then copies only a 1/world share of them, so a pause copies the
replicas once in all, and a restore gives every rank the whole of them.
A restored job continues from the same step with the same RNG streams, so its losses are
bit-identical to an uninterrupted run's.

A request arrives through the control channel (:mod:`rota.jobfiles.control`) and is served
at the next safe point: the registered tensors are copied into the staging folder (tmpfs),
the rank acknowledges, and, for a pause, waits a bounded time for the agent's decision:
on commit the process exits (:class:`Paused`, exit status 0) and its devices are free; on
abort, or when no decision comes in time, it trains on as if nothing happened. A paused
process skips the interpreter's teardown (``fast_exit=False`` keeps it): stdio and logging
are flushed, then it exits at once, since only its exit frees the devices. Ranks of a
``torch.distributed`` job agree on which request to serve and on the decision through two
tiny collectives, so they stop at the same step or not at all: never half of them. A gang's
ranks span nodes, each node's agent writing the same request into its own control folder:
a request is served once every rank has seen it, and the vote spans every node.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rota import imageformat
from rota.jobfiles import control

ENV_RESTORE_TIMEOUT = "ROTA_RESTORE_TIMEOUT"
ENV_IN_PLACE = "ROTA_RESTORE_IN_PLACE"  # 0: a module's load_state_dict copies into its own tensors, as before
# How long past a request's deadline a paused rank waits for the agent's decision before
# it decides "abort" itself: the agent decides the moment the last rank acknowledges.
DECISION_GRACE_S = 10.0


class Paused(SystemExit):  # noqa: N818 - it is an exit, like SystemExit
    """Raised by a safe point once a pause is committed: the process exits with status 0."""

    def __init__(self, step: int) -> None:
        super().__init__(0)
        self.step = step


def _exit_now() -> None:
    """Ends a paused process without the interpreter's teardown of torch (about a second
    here), which would only delay freeing the devices: the state is already copied out."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = _dist()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _dist() -> Any:
    """torch.distributed when a process group of more than one rank is up, else None.
    Never imports torch: a job that did not import it (a job with no tensors) has no group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


class Checkpointer:
    def __init__(self, *, rank: int | None = None, world_size: int | None = None, fast_exit: bool = True,
                 replicated: tuple[str, ...] = (), **objects: Any) -> None:
        for name, obj in objects.items():
            if not (_is_generator(obj) or (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"))):
                raise TypeError(f"{name}: needs state_dict()/load_state_dict() or to be a torch.Generator")
        unknown = sorted(set(replicated) - set(objects))
        if unknown:
            raise ValueError(f"replicated: {unknown} are not registered objects ({sorted(objects)})")
        self.objects = objects
        self.fast_exit = fast_exit
        # Objects identical on every rank (data parallel): each rank copies a share of them.
        self.replicated = frozenset(f"object:{name}" for name in replicated)
        self._cleanup: Path | None = None
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.step = 0
        self.cursor: Any = None
        self.extra: dict[str, Any] = {}
        # Where the last restore's time went (unix times): the image ready to read, the
        # state rebuilt from it and applied to the registered objects.
        self.restore_timings: dict[str, float] = {}
        self.served = 0  # the newest request seq this rank has answered
        control_dir = os.environ.get(control.ENV_CONTROL_DIR)
        self.control = Path(control_dir) if control_dir else None
        if self.control is not None:
            control.register(self.control, self.rank, self.world_size)

    # Restore.
    def restore(self) -> int:
        """Loads the image named by the agent (ROTA_RESTORE_DIR), if any; returns its step."""
        folder = os.environ.get(control.ENV_RESTORE_DIR)
        if not folder:
            return 0
        path = Path(folder)
        _wait_ready(path, float(os.environ.get(ENV_RESTORE_TIMEOUT, "600")))
        ready = time.time()
        index, state = imageformat.load(path, self.rank)
        if index["world_size"] != self.world_size:
            raise RuntimeError(f"the image has {index['world_size']} ranks; this job runs {self.world_size}")
        self._apply(state)
        self.restore_timings = {"t_ready": ready, "t_loaded": time.time()}
        # Free the tmpfs copy as soon as no rank needs it: other ranks may read this one's
        # share of replicated state, so then only once every rank has loaded.
        if any(_shared_part(path, r) for r in _local_ranks(self.rank, self.world_size)):
            (path / f"loaded-{self.rank}").touch()
            self._cleanup = path
            self._clean_restore()
        else:
            self._drop_restore(path)
        return self.step

    def _clean_restore(self) -> None:
        assert self._cleanup is not None
        if all((self._cleanup / f"loaded-{r}").exists() for r in _local_ranks(self.rank, self.world_size)):
            self._drop_restore(self._cleanup)
            self._cleanup = None

    def _drop_restore(self, path: Path) -> None:
        for p in (imageformat.blob_path(path, self.rank), imageformat.index_path(path, self.rank)):
            p.unlink(missing_ok=True)

    def _apply(self, state: dict[str, Any]) -> None:
        for name, obj in self.objects.items():
            saved = state.get(f"object:{name}")
            if saved is None:
                names = sorted(k.removeprefix("object:") for k in state if k.startswith("object:"))
                raise RuntimeError(f"the image has no state for {name!r} (it has {names})")
            if _is_generator(obj):
                obj.set_state(saved)
            elif os.environ.get(ENV_IN_PLACE, "1") != "0" and _is_module(obj):
                _load_in_place(obj, saved)
            else:
                obj.load_state_dict(saved)
        rng = state["rng"]
        random.setstate(rng["python"])
        if rng.get("numpy") is not None:
            import numpy as np

            np.random.set_state(rng["numpy"])
        if rng.get("torch") is not None:
            import torch

            torch.set_rng_state(rng["torch"])
            if rng.get("cuda") is not None and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(rng["cuda"])
        self.step, self.cursor, self.extra = state["step"], state["cursor"], state["extra"]

    def snapshot(self) -> dict[str, Any]:
        """The live state as one structure (tensors shared, not copied). The RNGs of NumPy
        and torch are taken when the job imported them (a job that never did, such as one
        with no tensors, neither pays their import nor has their streams to keep)."""
        np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
        cuda = torch.cuda.get_rng_state_all() if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None
        rng = {"python": random.getstate(), "numpy": np.random.get_state() if np is not None else None,
               "torch": torch.get_rng_state() if torch is not None else None, "cuda": cuda}
        # One top-level entry per registered object: the image packs each one apart, so
        # what data-parallel ranks share (model, optimizer) is stored once.
        state: dict[str, Any] = {f"object:{n}": (o.get_state() if _is_generator(o) else o.state_dict())
                                 for n, o in self.objects.items()}
        return {**state, "rng": rng, "step": self.step, "cursor": self.cursor, "extra": self.extra}

    # The safe point.
    def safe_point(self, step: int, cursor: Any = None) -> None:
        """Call once per iteration, where the state is consistent: serves a pending request."""
        self.step, self.cursor = step, cursor
        if self._cleanup is not None:
            self._clean_restore()
        if self.control is None:
            return
        request = control.read_request(self.control)
        seen = request.seq if request is not None and request.seq > self.served and time.time() < request.deadline else 0
        dist = _dist()
        if dist is not None:
            # Served only once every rank has seen it: the ranks of a gang read the control
            # folders of several nodes, whose agents write the request a moment apart.
            seen = _all_reduce(dist, seen, "min")
        if not seen:
            return
        self.served = seen
        if request is None or request.seq != seen:
            request = None  # replaced meanwhile: this rank takes part in the vote, as "abort"
        decision = self._serve(request) if request is not None else control.ABORT
        if dist is not None:
            local = decision
            decision = control.COMMIT if _all_reduce(dist, int(decision == control.COMMIT), "min") else control.ABORT
            if local == control.COMMIT and decision == control.ABORT and request is not None:
                # The agent committed, other ranks (a gang's other node) did not: say so at
                # once, so the agent need not wait for an exit that will not come.
                control.write_vote(self.control, seen, decision)
        if decision == control.COMMIT and request is not None and request.kind == control.PAUSE:
            if self.fast_exit:
                # Runs first at exit (atexit is last-in, first-out), after the job's own
                # `finally` blocks have run on the way out.
                atexit.register(_exit_now)
            raise Paused(step)

    def _serve(self, request: control.Request) -> str:
        assert self.control is not None
        try:
            logical, copy_s = imageformat.stage(Path(request.staging), self.rank, self.world_size, self.step,
                                             self.snapshot(), self.replicated)
        except Exception as exc:  # noqa: BLE001 - the failure is the agent's answer, not the job's end
            control.write_ack(self.control, request.seq, self.rank, ok=False, step=self.step, error=f"{type(exc).__name__}: {exc}")
            shutil.rmtree(request.staging, ignore_errors=True)
            return control.ABORT
        control.write_ack(self.control, request.seq, self.rank, ok=True, step=self.step, bytes=logical, copy_s=copy_s)
        if request.kind != control.PAUSE:
            return control.COMMIT  # a checkpoint's copy is taken: train on at once
        return control.wait_decision(self.control, request.seq, request.deadline + DECISION_GRACE_S)


def _local_ranks(rank: int, world_size: int) -> range:
    """The ranks that share this process's restore folder: this node's rank group of a gang
    (LOCAL_WORLD_SIZE ranks from RANK - LOCAL_RANK, as torchrun and Rota's agent set them),
    else every rank of the job."""
    try:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return range(world_size)
    if not 0 < per_node < world_size or not 0 <= local < per_node or rank - local < 0:
        return range(world_size)
    return range(rank - local, rank - local + per_node)


def _shared_part(folder: Path, rank: int) -> bool:
    """Whether other ranks read `rank`'s part of the image. A part already gone was freed by
    its own rank, which frees it at once only when no rank reads it (every rank decides
    from the same indexes): a faster rank of a job without replicated state may have
    loaded and freed its part before this one looks."""
    try:
        return imageformat.uses_other_ranks(imageformat.read_index(folder, rank))
    except FileNotFoundError:
        return False


def _is_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _load_in_place(module: Any, saved: dict[str, Any]) -> None:
    """load_state_dict without the copy: each parameter and buffer of a plain module (the
    default _load_from_state_dict, no load hooks) whose image tensor matches it (device,
    dtype, shape) takes that tensor as its data (`param.data = tensor`: the same Parameter
    object, so an optimizer's references hold). On a zero-copy restore the tensor is a
    copy-on-write view of the chunk files (rota.imageformat.mapping): nothing is read until
    touched, and a step's writes copy only the pages they change. Everything else goes
    through the module's own load_state_dict; keys are checked as strictly as it does."""
    import torch

    base = torch.nn.Module._load_from_state_dict
    placed: set[str] = set()
    for prefix, sub in module.named_modules(remove_duplicate=False):
        if (type(sub)._load_from_state_dict is not base or sub._load_state_dict_pre_hooks
                or sub._load_state_dict_post_hooks):
            continue
        persistent = {k: v for k, v in sub._buffers.items() if k not in sub._non_persistent_buffers_set}
        for name, live in (*sub._parameters.items(), *persistent.items()):
            key = f"{prefix}.{name}" if prefix else name
            value = saved.get(key)
            if (live is None or not isinstance(value, torch.Tensor) or type(value) is not torch.Tensor
                    or type(live) not in (torch.Tensor, torch.nn.Parameter) or value.device != live.device
                    or value.dtype != live.dtype or value.shape != live.shape):
                continue
            live.data = value
            placed.add(key)
    result = module.load_state_dict({k: v for k, v in saved.items() if k not in placed}, strict=False)
    missing = [k for k in result.missing_keys if k not in placed]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"{type(module).__name__}: state keys missing {missing}, unexpected "
                           f"{result.unexpected_keys}")


def _is_generator(obj: Any) -> bool:
    torch = sys.modules.get("torch")  # a generator exists only once torch is imported
    return torch is not None and isinstance(obj, torch.Generator)


def _all_reduce(dist: Any, value: int, op: str) -> int:
    import torch

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
    return int(t.item())


def _wait_ready(folder: Path, timeout_s: float) -> None:
    """The agent prepares the image while the job starts; wait for it, boundedly."""
    deadline = time.monotonic() + timeout_s
    while not (folder / control.READY).exists():
        failed = folder / control.FAILED
        if failed.exists():
            raise RuntimeError(f"restore failed: {failed.read_text().strip()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"restore: the image in {folder} was not ready within {timeout_s:g}s")
        time.sleep(0.01)
