"""What a streaming target takes from the wire and what from the store (rota.agent.streaming),
and the rate cap both the background write and the streams share (rota.imagestore.pacing)."""

from __future__ import annotations

import pytest

from rota.agent.streaming import RANGE, Piece, plan_pieces
from rota.imagestore.pacing import RateCap
from rota.v1 import agent_pb2, checkpoint_pb2

MIB = 1 << 20


class HeldStore:
    """The store's one question here: does it hold a digest."""

    def __init__(self, held: set[str]) -> None:
        self.held = held

    def has(self, digest: str) -> bool:
        return digest in self.held


def described(files: dict[str, int], stored: list[tuple[str, int, int, str]]) -> agent_pb2.DescribeStagedResponse:
    return agent_pb2.DescribeStagedResponse(
        image_state=checkpoint_pb2.IMAGE_STATE_WRITING,
        files=[agent_pb2.StagedFile(name=n, size=s) for n, s in files.items()],
        stored=[agent_pb2.StoredPiece(name=n, offset=o, length=k, digest=d) for n, o, k, d in stored])


def coverage(pieces: list[Piece], name: str) -> list[tuple[int, int]]:
    return sorted((p.offset, p.offset + p.length) for p in pieces if p.name == name)


CASES = [
    # (files, stored pieces, digests the store holds, bytes from the store)
    ({"rank-0.bin": 20 * MIB, "rank-0.json": 900}, [], set(), 0),
    ({"rank-0.bin": 20 * MIB}, [("rank-0.bin", 4 * MIB, 4 * MIB, "a"), ("rank-0.bin", 12 * MIB, 4 * MIB, "b")],
     {"a", "b"}, 8 * MIB),
    # The source says it stored "b", but this target's store does not have it: the wire.
    ({"rank-0.bin": 20 * MIB}, [("rank-0.bin", 4 * MIB, 4 * MIB, "a"), ("rank-0.bin", 12 * MIB, 4 * MIB, "b")],
     {"a"}, 4 * MIB),
    # Overlapping and out-of-file pieces are not believed: those bytes come from the wire.
    ({"rank-0.bin": 10 * MIB}, [("rank-0.bin", 0, 4 * MIB, "a"), ("rank-0.bin", 2 * MIB, 4 * MIB, "b"),
                                ("rank-0.bin", 8 * MIB, 4 * MIB, "c")], {"a", "b", "c"}, 4 * MIB),
    # A piece of another file, or of none, is never applied to this one.
    ({"rank-0.bin": 8 * MIB, "rank-1.bin": 8 * MIB}, [("rank-1.bin", 0, 8 * MIB, "a"), ("rank-9.bin", 0, 8, "z")],
     {"a", "z"}, 8 * MIB),
]


@pytest.mark.parametrize(("files", "stored", "held", "from_store"), CASES)
def test_every_byte_of_every_file_comes_once_from_the_wire_or_the_store(
        files: dict[str, int], stored: list[tuple[str, int, int, str]], held: set[str], from_store: int) -> None:
    pieces = plan_pieces(described(files, stored), HeldStore(held))  # type: ignore[arg-type]
    for name, size in files.items():
        spans = coverage(pieces, name)
        assert spans[0][0] == 0 and spans[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), spans  # no gap, no overlap
    assert sum(p.length for p in pieces if p.digest) == from_store
    assert all(p.length <= RANGE for p in pieces if not p.digest)
    assert all(p.digest in held for p in pieces if p.digest)


def test_the_wire_ranges_go_largest_first_and_the_store_reads_after() -> None:
    pieces = plan_pieces(described({"rank-0.bin": 17 * MIB + 5}, [("rank-0.bin", 0, MIB, "a")]),
                         HeldStore({"a"}))  # type: ignore[arg-type]
    wire = [p.length for p in pieces if not p.digest]
    assert wire == sorted(wire, reverse=True) and pieces[-1].digest == "a"


def test_a_rate_cap_books_senders_one_after_another() -> None:
    cap = RateCap(mbps=10)  # 10 MB/s: a 5 MB send books half a second
    assert cap.reserve(5_000_000, now=100.0) == 0.0
    assert cap.reserve(5_000_000, now=100.0) == pytest.approx(0.5)
    assert cap.reserve(1_000_000, now=100.2) == pytest.approx(0.8)
    assert cap.reserve(1_000_000, now=200.0) == 0.0  # idle since: nothing to wait for


def test_no_cap_never_waits() -> None:
    cap = RateCap(mbps=0)
    assert [cap.reserve(1 << 30, now=0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
