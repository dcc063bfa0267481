"""The agent's half of checkpoints: the two-phase request to a job's ranks, background image
writes, and materialising images for restores.

Pause, step by step: (1) write a request into the job's control folder; (2) wait, at most
the timeout, for every registered rank to acknowledge with its copy taken (at its next
safe point, into a tmpfs staging folder); (3a) all acked: mark the job folder "paused"
(so an exit reads as PAUSED, never SUCCEEDED or FAILED), write "commit", wait for the
ranks to exit: the devices are free; (3b) any rank missing or failed: write "abort",
every rank trains on, the call fails with the reason; (4) write the image from the staged
copy to the chunk store in the background. Every image has a record file under
`images/`, so a restarted agent finishes (or fails) the writes it had started.

A restore need not wait for that write when the staged copy is on the same machine: while
it is being written, the copy is offered under `handoff/` beside the staging folders (a
tmpfs of this host, so only agents here see it), and a restore of that image started
meanwhile (a warm target: its process and imports under way while the source pauses) takes
the staged files by hard links, no byte copied, while the durable write goes on. The store
stays the fallback: once the write is done the offer is gone and restores read the store.

A target on another node streams the staged copy from this agent instead
(rota.agent.streaming): a restore launched with the source agent's address fills its
folder over gRPC while the write goes on, reads the store once the image is complete
there, and restores the job's last good image when the write failed. A restore's request
is kept beside its folder (`restore.json`), so a restarted agent takes up the restores its
adopted jobs still wait for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rota import imageformat
from rota.agent.processes import PAUSED_MARKER, LocalJob, ProcessTable
from rota.agent.streaming import SourceUnreachable, StagedFailed, StagedGone, StagedStreams
from rota.common import metrics
from rota.core.errors import FailedPrecondition, InvalidArgument
from rota.imagestore import images
from rota.imagestore.pacing import RateCap
from rota.imagestore.settings import EXIT_GRACE_S, CheckpointSettings, default_staging_root
from rota.jobfiles import control

log = logging.getLogger(__name__)
POLL_S = 0.002  # the agent's polls of the control folder: a stat per poll
WRITING, COMPLETE, FAILED = "writing", "complete", "failed"
STREAM_WAIT_S = 600.0  # a streamed restore waits this long for its source or the store (the runtime's own wait)
RETRY_S = 0.2  # between a streamed restore's tries at an unreachable source
RESTORE_REQUEST = "restore.json"
STREAMED, GONE, UNREACHABLE = "streamed", "gone", "unreachable"  # how a try at streaming went


@dataclass
class ImageRecord:
    image_id: str
    job_id: str
    staging: str
    ranks: int
    step: int
    pause: bool
    logical_bytes: int
    copy_s: float
    pause_s: float
    state: str = WRITING
    # A gang's node copies only its rank group: those ranks of a world of `world`; the
    # coordinator joins every node's part into the image ([]: every rank, image whole here).
    rank_ids: list[int] = field(default_factory=list)
    world: int = 0
    error: str = ""
    written_bytes: int = 0
    chunks: int = 0
    write_s: float = 0.0
    manifest: dict[str, Any] | None = field(default=None, repr=False)
    created: float = field(default_factory=time.time)


class AgentCheckpoints:
    def __init__(self, node: str, table: ProcessTable, home: Path, settings: CheckpointSettings,
                 streams: StagedStreams | None = None) -> None:
        self.table = table
        self.streams = streams
        self.settings = settings
        self.store = settings.store()
        self.staging_root = settings.staging_root or default_staging_root(node)
        self.records_dir = home / "images"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, ImageRecord] = {}
        self._records_lock = threading.Lock()
        # One background write at a time: it competes with training for the same cores.
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-writer")
        # Restores must not queue behind a long background write: a pool of their own, with
        # room for a few at once (a streamed restore may wait minutes for a restarting source).
        self.restorer = ThreadPoolExecutor(max_workers=4, thread_name_prefix="image-restore")
        self._job_locks: dict[str, asyncio.Lock] = {}
        # Pieces of the images being written that the store holds so far: (rank, offset, length, digest).
        self._stored: dict[str, list[tuple[int, int, int, str]]] = {}
        self._stored_lock = threading.Lock()
        self.write_cap = RateCap(settings.write_mbps)

    def staging_of(self, job_id: str, epoch: int) -> Path:
        return self.staging_root / f"{job_id}-{epoch}"

    def restore_dir(self, job_id: str, epoch: int) -> Path:
        return self.staging_of(job_id, epoch) / "restore"

    # Adoption after a restart: finish the writes whose staged copy survived.
    def adopt(self, max_age_s: float = 86400.0) -> None:
        for path in self.records_dir.glob("*.json"):
            record = ImageRecord(**json.loads(path.read_text()))
            if record.state != WRITING and time.time() - record.created > max_age_s:
                path.unlink(missing_ok=True)
                continue
            self.records[record.image_id] = record
            if record.state == WRITING:
                if all(imageformat.index_path(Path(record.staging), r).exists() for r in record_ranks(record)):
                    self.writer.submit(self._write, record)
                else:
                    self._finish(record, FAILED, error="the agent restarted and the staged copy is gone")

    # Checkpoint and pause.
    async def checkpoint(self, job_id: str, epoch: int, image_id: str, pause: bool, timeout_s: float,
                         skip_unregistered: bool, seq: int = 0, local_ranks: tuple[int, ...] = ()) -> ImageRecord | None:
        if not job_id or not image_id:
            raise InvalidArgument("job_id" if not job_id else "image_id", "required")
        known = self.records.get(image_id)
        if known is not None:
            return known  # a retried request: the copy was taken already
        job = self.table.jobs.get(job_id)
        if job is None or job.exit_code() is not None:
            raise FailedPrecondition(f"{job_id} is not running on {self.table.node}")
        if epoch and job.epoch != epoch:
            raise FailedPrecondition(f"stale epoch {epoch} for {job_id}: this node runs epoch {job.epoch}")
        lock = self._job_locks.setdefault(job_id, asyncio.Lock())
        async with lock:
            # A thread, not a task: once asked, the ranks always get a decision, even when
            # the caller gives up or is cancelled half-way.
            return await asyncio.to_thread(self._quiesce, job, image_id, pause, timeout_s, skip_unregistered,
                                           seq, local_ranks)

    def _quiesce(self, job: LocalJob, image_id: str, pause: bool, timeout_s: float,
                 skip_unregistered: bool, seq: int = 0, local_ranks: tuple[int, ...] = ()) -> ImageRecord | None:
        folder = job.folder / "control"
        started = time.time()
        deadline = started + timeout_s
        world = self._wait_registered(job, folder, deadline, skip_unregistered, local_ranks)
        if world == 0:
            return None
        # The ranks this node answers for: a gang's node, its rank group; else all of them.
        expected = sorted(local_ranks) if local_ranks else list(range(world))
        last = control.read_request(folder)
        if seq <= 0:
            seq = last.seq + 1 if last is not None else 1
        elif last is not None and last.seq >= seq:
            raise FailedPrecondition(f"request {seq} for {job.job_id} is stale: this node served request {last.seq}")
        staging = self.staging_of(job.job_id, job.epoch) / f"ckpt-{seq}"
        kind = control.PAUSE if pause else control.CHECKPOINT
        control.write_request(folder, control.Request(seq, kind, deadline, str(staging)))
        acks = self._wait_acks(job, folder, seq, expected, deadline)
        failed = {r: a for r, a in acks.items() if not a.get("ok")}
        missing = sorted(set(expected) - set(acks))
        if failed or missing:
            control.write_decision(folder, seq, control.ABORT)
            shutil.rmtree(staging, ignore_errors=True)
            raise FailedPrecondition(_why(job, world, timeout_s, failed, missing) + "; every rank carries on")
        copy_s = time.time() - started
        pause_s = 0.0
        if pause:
            (job.folder / PAUSED_MARKER).write_text(image_id)
            control.write_decision(folder, seq, control.COMMIT)
            pids = [int(r["pid"]) for r in control.registrations(folder).values()]
            if not self._wait_exit(job, pids, EXIT_GRACE_S, lambda: control.read_vote(folder, seq) == control.ABORT):
                (job.folder / PAUSED_MARKER).unlink(missing_ok=True)
                shutil.rmtree(staging, ignore_errors=True)
                if control.read_vote(folder, seq) == control.ABORT:
                    raise FailedPrecondition(f"{job.job_id}: the ranks on other nodes did not all take their copy, "
                                             "so no rank paused; every rank carries on")
                raise FailedPrecondition(f"{job.job_id} acknowledged the pause but did not exit within {EXIT_GRACE_S:g}s")
            pause_s = time.time() - started
        else:
            control.write_decision(folder, seq, control.COMMIT)
        steps = sorted({int(a["step"]) for a in acks.values()})
        record = ImageRecord(
            image_id=image_id, job_id=job.job_id, staging=str(staging), ranks=len(expected), step=steps[0], pause=pause,
            logical_bytes=sum(int(a.get("bytes", 0)) for a in acks.values()), copy_s=copy_s, pause_s=pause_s,
            rank_ids=expected if local_ranks else [], world=world,
        )
        self._save(record)
        if not record.rank_ids and self.settings.handoff:  # a whole image: a restore here may take it now
            self._offer(record)
        self.writer.submit(self._write, record)
        return record

    # The staged copy offered to restores on this host while it is being written.
    def handoff_path(self, image_id: str) -> Path:
        return self.staging_root.parent / "handoff" / f"{image_id}.json"

    def _offer(self, record: ImageRecord) -> None:
        path = self.handoff_path(record.image_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        control.write_atomic(path, json.dumps({"staging": record.staging, "ranks": record.ranks}))

    def _take_offer(self, folder: Path, image_id: str) -> bool:
        """Hard links of the staged copy of `image_id` into the restore folder, READY: the
        job loads them while the source's write goes on. False when none is offered here
        (or it went meanwhile, or is on another filesystem)."""
        try:
            offer = json.loads(self.handoff_path(image_id).read_text())
        except (FileNotFoundError, ValueError):
            return False
        staging = Path(offer["staging"])
        folder.mkdir(parents=True, exist_ok=True)
        linked: list[Path] = []
        try:
            for rank in range(int(offer["ranks"])):
                for source in (imageformat.blob_path(staging, rank), imageformat.index_path(staging, rank)):
                    target = folder / source.name
                    target.unlink(missing_ok=True)
                    os.link(source, target)
                    linked.append(target)
        except OSError:  # written and removed meanwhile, or another filesystem: the store has it
            for target in linked:
                target.unlink(missing_ok=True)
            return False
        control.write_atomic(folder / control.READY, "")
        return True

    def _wait_registered(self, job: LocalJob, folder: Path, deadline: float, skip: bool,
                         local_ranks: tuple[int, ...] = ()) -> int:
        """The job's world size, once every rank this node runs has registered."""
        while True:
            regs = control.registrations(folder)
            world = max((int(r["world_size"]) for r in regs.values()), default=0)
            if world and set(local_ranks or range(world)) <= set(regs):
                return world
            if skip and not regs:
                return 0
            if time.time() >= deadline or job.exit_code() is not None:
                if not regs:
                    raise FailedPrecondition(
                        f"{job.job_id} has not registered its state with rota.runtime (no Checkpointer, "
                        "or it did not start in time): it cannot be checkpointed"
                    )
                raise FailedPrecondition(f"only ranks {sorted(regs)} of {world} registered with rota.runtime in time")
            time.sleep(POLL_S * 4)

    def _wait_acks(self, job: LocalJob, folder: Path, seq: int, expected: list[int],
                   deadline: float) -> dict[int, dict[str, Any]]:
        while True:
            acks = control.read_acks(folder, seq)
            if set(expected) <= set(acks) or any(not a.get("ok") for a in acks.values()):
                return acks
            if time.time() >= deadline or job.exit_code() is not None:
                return acks
            time.sleep(POLL_S)

    @staticmethod
    def _wait_exit(job: LocalJob, pids: list[int], grace_s: float, overruled: Callable[[], bool]) -> bool:
        """Until every rank process is gone: their exit frees the devices (a launcher
        such as mp.spawn's parent may take a moment longer; it holds no device). False
        when the grace runs out, or at once when the ranks' vote overruled the commit."""
        until = time.monotonic() + grace_s
        while job.exit_code() is None and any(_alive(pid) for pid in pids):
            if time.monotonic() > until or overruled():
                return False
            time.sleep(POLL_S)
        return True

    # The background write.
    def _write(self, record: ImageRecord) -> None:
        staging = Path(record.staging)
        with self._stored_lock:
            self._stored[record.image_id] = []

        def stored(rank: int, offset: int, length: int, digest: str) -> None:
            with self._stored_lock:
                self._stored.setdefault(record.image_id, []).append((rank, offset, length, digest))

        try:
            result = images.write_staged(self.store, staging, record_ranks(record), self.settings.chunk_size,
                                         on_stored=stored, cap=self.write_cap)
            if not record.rank_ids:  # a gang's part: the coordinator stores the joined manifest
                self.store.put_manifest(record.image_id, json.dumps(result.manifest).encode())
            record.manifest = result.manifest
            record.written_bytes, record.chunks, record.write_s = result.written_bytes, result.chunks, result.seconds
            record.logical_bytes = result.logical_bytes
            # The offer ends before the record says the write did: whoever sees "complete"
            # reads the store, never a staged copy about to be deleted.
            self.handoff_path(record.image_id).unlink(missing_ok=True)
            self._finish(record, COMPLETE)
        except Exception as exc:  # noqa: BLE001 - recorded for the coordinator
            log.exception("writing image %s failed", record.image_id)
            self.handoff_path(record.image_id).unlink(missing_ok=True)
            self._finish(record, FAILED, error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._stored_lock:
                self._stored.pop(record.image_id, None)
            shutil.rmtree(staging, ignore_errors=True)
            try:
                staging.parent.rmdir()  # the launch's staging folder, once nothing else is in it
            except OSError:
                pass

    def _finish(self, record: ImageRecord, state: str, error: str = "") -> None:
        record.state, record.error = state, error
        self._save(record)

    def _save(self, record: ImageRecord) -> None:
        with self._records_lock:
            self.records[record.image_id] = record
            path = self.records_dir / f"{record.image_id}.json"
            control.write_atomic(path, json.dumps(asdict(record)))

    def status(self, image_id: str) -> ImageRecord | None:
        return self.records.get(image_id)

    def stored_pieces(self, image_id: str) -> list[tuple[int, int, int, str]]:
        """The pieces of an image being written that the store holds so far."""
        with self._stored_lock:
            return list(self._stored.get(image_id, ()))

    # Restores.
    def start_restore(self, folder: Path, image_id: str, wait_s: float = 0.0, source: str = "",
                      fallback: str = "") -> None:
        """Prepares the image beside the starting job (its runtime waits for READY). With
        `wait_s`, the image may still be being taken (a warm target, started while the
        source pauses): it waits that long for the staged copy's offer or the stored image.
        With `source` (the address of the agent writing it), it streams the staged copy from
        there meanwhile, and restores `fallback` if the write fails."""
        folder.mkdir(parents=True, exist_ok=True)
        request = {"image_id": image_id, "wait_s": wait_s, "source": source, "fallback": fallback,
                   "until": time.time() + wait_s}
        control.write_atomic(folder / RESTORE_REQUEST, json.dumps(request))
        self.restorer.submit(self._materialize, folder, image_id, wait_s, source, fallback)

    def resume_restores(self) -> int:
        """After a restart: the restores that adopted jobs still wait for, started again."""
        resumed = 0
        for job in self.table.jobs.values():
            folder = self.restore_dir(job.job_id, job.epoch)
            if job.exit_code() is not None or (folder / control.READY).exists() or (folder / control.FAILED).exists():
                continue
            try:
                request = json.loads((folder / RESTORE_REQUEST).read_text())
            except (FileNotFoundError, ValueError):
                continue
            left = max(0.0, float(request.get("until", 0.0)) - time.time())
            self.restorer.submit(self._materialize, folder, str(request["image_id"]), left,
                                 str(request.get("source", "")), str(request.get("fallback", "")))
            resumed += 1
        return resumed

    def _materialize(self, folder: Path, image_id: str, wait_s: float = 0.0, source: str = "",
                     fallback: str = "") -> None:
        until = time.monotonic() + wait_s
        try:
            try:
                manifest = self._manifest(folder, image_id, until, source)
            except StagedFailed as exc:
                if not fallback:
                    raise RuntimeError(f"its write failed at the source ({exc}) and the job has "
                                       "no earlier image") from exc
                log.warning("image %s failed at its source (%s): restoring %s", image_id, exc, fallback)
                image_id = fallback
                manifest = self._manifest(folder, image_id, until, "")
            if manifest is None:
                return
            # Chunks in local files are read in place by the job; otherwise copied here first.
            if not images.link(self.store, manifest, folder, verify=self.settings.verify):
                images.materialize(self.store, manifest, folder, verify=self.settings.verify)
        except Exception as exc:  # noqa: BLE001 - the job reads the reason and fails with it
            log.exception("materialising image %s failed", image_id)
            folder.mkdir(parents=True, exist_ok=True)
            control.write_atomic(folder / control.FAILED, f"image {image_id}: {type(exc).__name__}: {exc}")

    def _manifest(self, folder: Path, image_id: str, until: float, source: str) -> Any | None:
        """The image's manifest once the store has it (waiting until `until`, a monotonic time), or
        None when the job's folder was filled otherwise: a local copy offered, or the staged copy
        streamed. StagedFailed: the source's write failed."""
        tries, outcome = 0, ""
        while True:
            try:
                return json.loads(self.store.get_manifest(image_id))
            except FileNotFoundError:
                if self._take_offer(folder, image_id):
                    return None
                if source:
                    tries += 1
                    outcome = self._stream(folder, image_id, source, quiet=tries % 25 != 1)
                    if outcome == STREAMED:
                        return None
                if time.monotonic() >= until:
                    raise
            # A source that answered (no staged copy yet: its ranks are still copying) is
            # asked again soon; one that did not, less often.
            time.sleep(RETRY_S if source and outcome == UNREACHABLE else POLL_S * 5)

    def _stream(self, folder: Path, image_id: str, source: str, quiet: bool = False) -> str:
        """The staged copy from the source agent, READY (STREAMED); else why not now: GONE
        (the source holds no staged copy: not yet, or its write ended and the store has it)
        or UNREACHABLE. `quiet`: a retry, not logged (a source down is told every 5 s)."""
        if self.streams is None:
            return UNREACHABLE
        try:
            result = self.streams.fetch(source, image_id, folder, self.store)
        except (StagedGone, SourceUnreachable) as exc:
            log.log(logging.DEBUG if quiet else logging.INFO, "streaming image %s from %s: %s", image_id, source, exc)
            return GONE if isinstance(exc, StagedGone) else UNREACHABLE
        control.write_atomic(folder / control.READY, "")
        metrics.CHECKPOINT_STREAM_BYTES.labels(via="wire").inc(result.wire_bytes)
        metrics.CHECKPOINT_STREAM_BYTES.labels(via="store").inc(result.store_bytes)
        metrics.CHECKPOINT_STREAM_SECONDS.observe(result.seconds)
        log.info("streamed image %s from %s in %.2fs: %d bytes over the wire, %d from the store", image_id, source,
                 result.seconds, result.wire_bytes, result.store_bytes)
        return STREAMED

    def forget(self, job: LocalJob) -> None:
        """A finished launch's tmpfs leftovers: a restore it never loaded, a copy a late rank
        staged after its request was aborted. Copies still being written stay."""
        folder = self.staging_of(job.job_id, job.epoch)
        pending = {r.staging for r in self.records.values() if r.state == WRITING}
        for child in folder.glob("*"):
            if str(child) not in pending:
                shutil.rmtree(child, ignore_errors=True)
        if not pending & {str(c) for c in folder.glob("*")}:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        self.writer.shutdown(wait=False)
        self.restorer.shutdown(wait=False)
        if self.streams is not None:
            self.streams.close()


def record_ranks(record: ImageRecord) -> list[int]:
    """The ranks an image record's copy holds."""
    return list(record.rank_ids) or list(range(record.ranks))


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (exited, not yet reaped)."""
    if not Path("/proc/self").exists():  # no procfs: existence is all we can tell
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _why(job: LocalJob, world: int, timeout_s: float, failed: dict[int, dict[str, Any]], missing: list[int]) -> str:
    if failed:
        rank, ack = next(iter(sorted(failed.items())))
        return f"rank {rank} of {world} failed to copy its state: {ack.get('error', 'unknown error')}"
    if job.exit_code() is not None:
        return f"{job.job_id} exited (code {job.exit_code()}) before ranks {missing} of {world} reached a safe point"
    return f"ranks {missing} of {world} did not reach a safe point within {timeout_s:g}s"
