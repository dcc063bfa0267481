"""A zero-copy restore assigns the image's mapped tensors to a module in place: the job's
Parameter objects stay (an optimizer's references hold), their data are copy-on-write views
of the store's chunk files (mapped lazily, never prefaulted: a prefault of a private mapping
copies every page), and the restored job continues bit-identically."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest
import torch

from rota import imageformat
from rota.imageformat import mapping
from rota.imagestore.chunks import FileChunkStore
from rota.imagestore.images import chunk_digests, link, write_staged
from rota.jobfiles import control
from rota.runtime import Checkpointer, state

KIB = 1024


def model_and_opt(seed: int) -> tuple[Any, torch.optim.Optimizer]:  # Any: a Sequential with an extra child
    torch.manual_seed(seed)
    # A large weight (its own segment, several chunks), small ones (packed), a BatchNorm
    # (its own _load_from_state_dict: loaded by copy) and a weight tied to another.
    model: Any = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.BatchNorm1d(512), torch.nn.Linear(512, 512))
    model.add_module("tied", torch.nn.Linear(512, 512))
    model.tied.weight = model[2].weight
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(2):
        x = torch.randn(8, 256, generator=gen)
        loss = model.tied(model(x)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def losses(model: Any, opt: torch.optim.Optimizer) -> list[float]:
    gen = torch.Generator().manual_seed(42)
    out = []
    for _ in range(3):
        loss = model.tied(model(torch.randn(8, 256, generator=gen))).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, torch.optim.Optimizer, list[float],
                                                                          FileChunkStore, dict[str, int]]:
    model, opt = model_and_opt(1)
    ckpt = Checkpointer(model=model, optimizer=opt)
    ckpt.step = 2
    imageformat.stage(tmp_path / "s", 0, 1, 2, ckpt.snapshot())
    want = losses(model, opt)
    store = FileChunkStore(tmp_path / "store", fsync=False)
    result = write_staged(store, tmp_path / "s", 1, 64 * KIB)
    assert link(store, result.manifest, tmp_path / "r")
    fresh, fresh_opt = model_and_opt(2)  # other weights and moments
    monkeypatch.setenv(control.ENV_RESTORE_DIR, str(tmp_path / "r"))
    assert Checkpointer(model=fresh, optimizer=fresh_opt).restore() == 2
    return fresh, fresh_opt, want, store, chunk_digests(result.manifest)


def test_a_restore_assigns_the_mapped_tensors_in_place_and_continues_bit_identically(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = model_and_opt(2)[0]
    ids = {name: id(p) for name, p in before.named_parameters()}
    fresh, opt, want, store, digests = restored(tmp_path, monkeypatch)
    assert {name: id(p) for name, p in fresh.named_parameters()}.keys() == ids.keys()
    assert all(p is q for p, q in zip(opt.param_groups[0]["params"], fresh.parameters(), strict=True))
    weight = fresh[2].weight  # 1 MiB: a view of its chunk files, mapped, not memory of its own
    assert mapped_file(weight.data_ptr()).startswith(str(tmp_path / "store"))
    assert fresh.tied.weight is weight
    files = {d: store.path(d).read_bytes() for d in digests}
    assert losses(fresh, opt) == want  # bit-identical: the same losses as the job never paused
    assert all(store.path(d).read_bytes() == data for d, data in files.items())  # copy-on-write


def test_without_in_place_the_module_copies_the_image_into_its_own_tensors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(state.ENV_IN_PLACE, "0")
    fresh, opt, want, _, _ = restored(tmp_path, monkeypatch)
    weight = fresh[2].weight
    assert not mapped_file(weight.data_ptr()).startswith(str(tmp_path / "store"))  # its own memory
    assert losses(fresh, opt) == want


def test_an_image_missing_a_key_fails_the_restore_as_load_state_dict_would(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = model_and_opt(1)
    snapshot = Checkpointer(model=model, optimizer=opt).snapshot()
    del snapshot["object:model"]["0.bias"]
    imageformat.stage(tmp_path, 0, 1, 1, snapshot)
    (tmp_path / control.READY).touch()
    monkeypatch.setenv(control.ENV_RESTORE_DIR, str(tmp_path))
    with pytest.raises(RuntimeError, match="0.bias"):
        Checkpointer(model=model_and_opt(2)[0]).restore()


def mapped_file(address: int) -> str:
    """The file mapped at `address` in this process ("" for anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= address < hi:
            return fields[5] if len(fields) > 5 else ""
    return ""


def resident_kib(address: int, length: int) -> int:
    """Rss of the mappings inside [address, address + length), from /proc/self/smaps."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo >= address and hi <= address + length
        elif inside and head == "Rss:":
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not mapping.available(), reason="Linux only")
def test_a_mapped_span_is_read_on_first_touch_not_at_map_time(tmp_path: Path) -> None:
    chunks = []
    for i in range(4):
        path = tmp_path / f"c{i}"
        path.write_bytes(bytes([i]) * (256 * KIB))
        chunks.append((str(path), 256 * KIB))
    span = mapping.map_chunks(chunks)
    anchor = ctypes.c_char.from_buffer(span)
    address = ctypes.addressof(anchor)
    del anchor
    assert resident_kib(address, len(span)) == 0  # nothing mapped yet
    assert span[3 * 256 * KIB] == 3 and span[0] == 0
    assert 0 < resident_kib(address, len(span)) < 1024
    span.close()
