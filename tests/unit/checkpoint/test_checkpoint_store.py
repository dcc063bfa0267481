"""The chunk store and images: fixed-size chunks, dedup across ranks and images, restore
with digest checks, and the collector's delete that loses every race against a writer."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from rota import imageformat
from rota.imagestore.chunks import FileChunkStore
from rota.imagestore.images import chunk_digests, digest_of, link, materialize, write_staged

KIB = 1024


def staged(folder: Path, ranks: int, state: dict[str, object], step: int = 1) -> None:
    for rank in range(ranks):
        imageformat.stage(folder, rank, ranks, step, state)


def model_state(seed: int, n: int = 300_000) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    return {"object:model": {"w": torch.randn(n, generator=gen), "b": torch.randn(10, generator=gen)}}


def test_put_stores_a_chunk_once_and_refreshes_it_when_reused(tmp_path: Path) -> None:
    store = FileChunkStore(tmp_path, fsync=False)
    data = os.urandom(1000)
    digest = digest_of(data)
    assert store.put(digest, data) is True
    old = time.time() - 3600
    os.utime(store.path(digest), (old, old))
    assert store.put(digest, data) is False  # present: not written again...
    assert store.path(digest).stat().st_mtime > old + 3000  # ...but touched
    view = bytearray(1000)
    store.read_into(digest, memoryview(view))
    assert bytes(view) == data
    assert [c.digest for c in store.chunks()] == [digest]


def test_retire_deletes_an_old_chunk_but_keeps_one_a_writer_touched(tmp_path: Path) -> None:
    store = FileChunkStore(tmp_path, fsync=False)
    old, fresh = os.urandom(100), os.urandom(100)
    for data in (old, fresh):
        store.put(digest_of(data), data)
    past = time.time() - 3600
    for data in (old, fresh):
        os.utime(store.path(digest_of(data)), (past, past))
    cutoff = time.time() - 60
    store.put(digest_of(fresh), fresh)  # a checkpoint reuses it after the collector listed it
    assert store.retire(digest_of(old), cutoff) is True
    assert store.retire(digest_of(fresh), cutoff) is False
    assert not store.has(digest_of(old)) and store.has(digest_of(fresh))
    assert store.retire(digest_of(old), cutoff) is False  # already gone
    assert list((tmp_path / "trash").iterdir()) == []


def test_a_writer_after_the_retire_writes_the_chunk_again(tmp_path: Path) -> None:
    store = FileChunkStore(tmp_path, fsync=False)
    data = os.urandom(100)
    store.put(digest_of(data), data)
    past = time.time() - 3600
    os.utime(store.path(digest_of(data)), (past, past))
    assert store.retire(digest_of(data), time.time() - 60)
    assert store.put(digest_of(data), data) is True
    assert store.has(digest_of(data))


def test_state_is_cut_into_fixed_size_chunks_per_tensor(tmp_path: Path) -> None:
    staged(tmp_path / "s", 1, model_state(1))
    result = write_staged(FileChunkStore(tmp_path / "store", fsync=False), tmp_path / "s", 1, chunk_size=256 * KIB)
    segments = result.manifest["ranks"][0]["segments"]
    big = next(s for s in segments if s["length"] == 300_000 * 4)  # the 1.2 MB tensor, a segment of its own
    assert [n for _, n in big["chunks"]] == [256 * KIB] * 4 + [300_000 * 4 - 4 * 256 * KIB]
    assert all(n <= 256 * KIB for s in segments for _, n in s["chunks"])


def test_replicated_ranks_are_stored_once(tmp_path: Path) -> None:
    state = model_state(2)
    staged(tmp_path / "one", 1, state)
    staged(tmp_path / "four", 4, state)
    one = write_staged(FileChunkStore(tmp_path / "a", fsync=False), tmp_path / "one", 1, 256 * KIB)
    four = write_staged(FileChunkStore(tmp_path / "b", fsync=False), tmp_path / "four", 4, 256 * KIB)
    assert four.logical_bytes == pytest.approx(4 * one.logical_bytes, rel=0.01)
    assert four.written_bytes == one.written_bytes  # identical ranks: not a byte more
    assert four.chunks == one.chunks


def test_unchanged_tensors_are_not_stored_again_by_the_next_image(tmp_path: Path) -> None:
    store = FileChunkStore(tmp_path / "store", fsync=False)
    state = model_state(3)
    staged(tmp_path / "first", 1, state)
    first = write_staged(store, tmp_path / "first", 1, 256 * KIB)
    changed = {"object:model": dict(state["object:model"])}  # type: ignore[call-overload]
    changed["object:model"]["b"] = torch.zeros(10)  # the small tensor changes; the big one does not
    staged(tmp_path / "second", 1, changed, step=2)
    second = write_staged(store, tmp_path / "second", 1, 256 * KIB)
    assert second.written_bytes < 0.05 * first.written_bytes
    assert set(chunk_digests(first.manifest)) & set(chunk_digests(second.manifest))


def test_materialize_rebuilds_every_rank_and_refuses_a_corrupt_chunk(tmp_path: Path) -> None:
    store = FileChunkStore(tmp_path / "store", fsync=False)
    state = model_state(4)
    staged(tmp_path / "s", 2, state)
    result = write_staged(store, tmp_path / "s", 2, 256 * KIB)
    materialize(store, result.manifest, tmp_path / "r")
    assert (tmp_path / "r" / "READY").exists()
    for rank in range(2):
        _, loaded = imageformat.load(tmp_path / "r", rank)
        assert torch.equal(loaded["object:model"]["w"], state["object:model"]["w"])  # type: ignore[index]
    victim = next(iter(chunk_digests(result.manifest)))
    path = store.path(victim)
    path.write_bytes(b"\0" * path.stat().st_size)
    with pytest.raises(ValueError, match="corrupt"):
        materialize(store, result.manifest, tmp_path / "r2")


def test_staged_images_keep_dtypes_shapes_ties_and_plain_values(tmp_path: Path) -> None:
    tied = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    state = {
        "object:model": {"a": tied, "also_a": tied, "half": torch.ones(3, dtype=torch.bfloat16),
                         "scalar": torch.tensor(7), "strided": torch.arange(10)[::2], "empty": torch.zeros(0, 4)},
        "extra": {"cursor": [1, "x"], "lr": 0.5},
    }
    imageformat.stage(tmp_path, 0, 1, 9, state)
    index, loaded = imageformat.load(tmp_path, 0)
    assert index["step"] == 9
    m = loaded["object:model"]
    assert m["a"] is m["also_a"]  # a tied tensor is written and read once
    assert torch.equal(m["a"], tied) and m["half"].dtype == torch.bfloat16 and m["scalar"].item() == 7
    assert m["strided"].tolist() == [0, 2, 4, 6, 8] and m["empty"].shape == (0, 4)
    assert loaded["extra"] == {"cursor": [1, "x"], "lr": 0.5}


def test_a_linked_restore_reads_every_rank_straight_from_the_chunk_files(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(5)
    model = {"w": torch.randn(300_000, generator=gen), "b": torch.randn(7, generator=gen)}
    for rank in range(2):  # the model is replicated and split: each rank copies half of it
        state = {"object:model": model, "rng": torch.full((3,), float(rank))}
        imageformat.stage(tmp_path / "s", rank, 2, 4, state, frozenset({"object:model"}))
    store = FileChunkStore(tmp_path / "store", fsync=False)
    result = write_staged(store, tmp_path / "s", 2, 64 * KIB)
    assert link(store, result.manifest, tmp_path / "r", verify=True)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["READY", "rank-0.json", "rank-1.json"]
    for rank in range(2):
        _, loaded = imageformat.load(tmp_path / "r", rank)
        assert torch.equal(loaded["object:model"]["w"], model["w"]) and torch.equal(loaded["object:model"]["b"], model["b"])
        assert loaded["rng"].tolist() == [float(rank)] * 3
    # Each rank stands for the whole model, though it copied half: the image counts both.
    assert result.logical_bytes > 2 * 300_000 * 4


def test_a_linked_restore_maps_the_chunk_files_in_place_copy_on_write(tmp_path: Path) -> None:
    """Zero-copy: a restored tensor is a view of its chunk files mapped in place (no copy
    of its bytes), writing into it never changes the store, and it stays readable after
    the collector deletes the chunks."""
    gen = torch.Generator().manual_seed(9)
    big = torch.randn(100_000, generator=gen)  # 400 KB: several 64 KiB chunks, its own segment
    small = torch.arange(10, dtype=torch.int64)
    imageformat.stage(tmp_path / "s", 0, 1, 3, {"object:model": {"w": big, "b": small}})
    store = FileChunkStore(tmp_path / "store", fsync=False)
    result = write_staged(store, tmp_path / "s", 1, 64 * KIB)
    assert link(store, result.manifest, tmp_path / "r")
    _, loaded = imageformat.load(tmp_path / "r", 0)
    w, b = loaded["object:model"]["w"], loaded["object:model"]["b"]
    assert torch.equal(w, big) and torch.equal(b, small)
    # A view of one mapped span per segment, not a tensor of its own memory.
    assert w.untyped_storage().nbytes() >= w.nbytes and w.untyped_storage().data_ptr() == w.data_ptr()
    assert b.untyped_storage().nbytes() > b.nbytes  # the packed segment holds more than b
    digests = chunk_digests(result.manifest)
    before = {d: store.path(d).read_bytes() for d in digests}
    w.add_(1.0)  # an optimizer's step: copy-on-write, the store's files keep their bytes
    assert all(store.path(d).read_bytes() == data for d, data in before.items())
    assert all(digest_of(data) == d for d, data in before.items())
    for d in digests:
        store.path(d).unlink()  # collected while the job runs
    assert torch.equal(w, big + 1.0) and torch.equal(b, small)


def test_without_zero_copy_a_restore_copies_every_tensor_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(imageformat.ENV_ZERO_COPY, "0")
    big = torch.randn(100_000, generator=torch.Generator().manual_seed(2))
    imageformat.stage(tmp_path / "s", 0, 1, 3, {"object:model": {"w": big}})
    store = FileChunkStore(tmp_path / "store", fsync=False)
    result = write_staged(store, tmp_path / "s", 1, 64 * KIB)
    assert link(store, result.manifest, tmp_path / "r")
    _, loaded = imageformat.load(tmp_path / "r", 0)
    w = loaded["object:model"]["w"]
    assert torch.equal(w, big) and w.untyped_storage().nbytes() == w.nbytes


def test_a_copy_through_the_reused_host_buffer_writes_every_byte_in_place(tmp_path: Path) -> None:
    """The device path of a pause (here with a host tensor): piece by piece through one
    buffer, kept for the next copy."""
    data = torch.randint(0, 256, (imageformat.BUFFER_BYTES + 12345,), dtype=torch.uint8)
    path = tmp_path / "blob"
    path.write_bytes(b"\0" * (len(data) + 4096))
    fd = os.open(path, os.O_RDWR)
    try:
        imageformat.copy_through_buffer(fd, data, 4096)
        first = imageformat.staged._host_buffer()
        imageformat.copy_through_buffer(fd, data[:10], 0)
    finally:
        os.close(fd)
    raw = path.read_bytes()
    assert raw[4096:] == bytes(data.numpy()) and raw[:10] == bytes(data[:10].numpy())
    assert imageformat.staged._host_buffer() is first  # allocated once, reused
