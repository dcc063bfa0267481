"""The local cluster's ports: every process gets a port of its own, even when the kernel
hands a just-probed port out again."""

from __future__ import annotations

from itertools import islice

import pytest

from rota.operator import localcluster


def test_a_port_the_kernel_hands_out_twice_is_given_once(monkeypatch: pytest.MonkeyPatch) -> None:
    probes = iter([45215, 45215, 50000, 45215, 50000, 50001])
    monkeypatch.setattr(localcluster, "free_port", lambda: next(probes))
    assert list(islice(localcluster.distinct_free_ports(), 3)) == [45215, 50000, 50001]


def test_real_probes_give_distinct_ports() -> None:
    ports = list(islice(localcluster.distinct_free_ports(), 20))
    assert len(set(ports)) == 20 and all(0 < p < 65536 for p in ports)
