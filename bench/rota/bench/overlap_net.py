"""Ranks in separate network namespaces joined by rate-limited veth links (``tc ... tbf``).

On loopback, gloo's communication threads and the compute fight for the same two cores and
bytes move at memory speed; across nodes a collective waits on the wire. Here each rank gets a
namespace; two ranks share one veth pair, more ranks hang off a bridge in a hub namespace
(a star of veths). Every rank's egress is shaped with a token bucket (this kernel has no
netem), so a collective's time is set by the rate, not by the CPUs.

Needs root (``ip netns``). :func:`shaped_link` removes every namespace it made on exit,
including on Ctrl-C or SIGTERM (deleting a namespace deletes its veth ends).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

__all__ = ["RankNet", "can_shape", "shaped_link"]

_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit)$")


@dataclass(frozen=True)
class RankNet:
    namespace: str
    interface: str
    address: str

    def prefix(self) -> list[str]:
        """The command prefix that runs a process inside this rank's namespace."""
        return ["ip", "netns", "exec", self.namespace]


def can_shape() -> str | None:
    """None when shaped links can be built here, else why not."""
    if os.geteuid() != 0:
        return "shaped links need root (ip netns, tc); run the bench as root or pass --links loopback"
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            return f"shaped links need the {tool!r} tool (iproute2)"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _shape(namespace: str, interface: str, rate: str, burst: str, latency: str) -> None:
    done = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", interface, "root", "tbf",
                           "rate", rate, "burst", burst, "latency", latency], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tc qdisc add dev {interface} tbf rate {rate}: {done.stderr.strip()}")


@contextmanager
def shaped_link(ranks: int, rate: str = "1gbit", burst: str = "64kb", latency: str = "200ms") -> Iterator[list[RankNet]]:
    """Namespaces for ``ranks`` ranks linked at ``rate`` each way; removed on exit."""
    if ranks < 2:
        raise ValueError(f"shaped link ranks must be at least 2, got {ranks}")
    if not _RATE.match(rate):
        raise ValueError(f"shaped link rate {rate!r} must look like 500mbit or 1gbit")
    tag = f"rov{os.getpid() % 100000}"
    made: list[str] = []
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        nets = []
        for r in range(ranks):
            ns = f"{tag}_r{r}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            nets.append(RankNet(ns, f"{tag}r{r}", f"10.77.{os.getpid() % 200}.{r + 1}"))
        if ranks == 2:
            a, b = nets
            _ip("link", "add", a.interface, "netns", a.namespace, "type", "veth", "peer", "name", b.interface,
                "netns", b.namespace)
        else:
            hub = f"{tag}_hub"
            _ip("netns", "add", hub)
            made.append(hub)
            _ip("-n", hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", hub, "link", "set", "br0", "up")
            for r, net in enumerate(nets):
                port = f"{tag}h{r}"
                _ip("link", "add", net.interface, "netns", net.namespace, "type", "veth", "peer", "name", port,
                    "netns", hub)
                _ip("-n", hub, "link", "set", port, "master", "br0")
                _ip("-n", hub, "link", "set", port, "up")
        for net in nets:
            _ip("-n", net.namespace, "addr", "add", f"{net.address}/24", "dev", net.interface)
            _ip("-n", net.namespace, "link", "set", net.interface, "up")
            _shape(net.namespace, net.interface, rate, burst, latency)
        yield nets
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        signal.signal(signal.SIGTERM, previous)
