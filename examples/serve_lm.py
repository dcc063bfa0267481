"""A realtime app: a small torch classifier answering generated requests on its replicas.

Under Rota's agent each process is one replica (`rota.runtime.replica()` names its GPU):
it serves one batch per tick, and the agent starts and stops replica processes, on any
nodes, as the allocator scales the app. Without that (run by hand, or by an older agent)
it polls `rota.runtime.replicas()` each second and serves one batch per replica listed.
It reports `replicas`, `served` and `epoch`; SIGTERM ends it cleanly.
"""

from __future__ import annotations

import argparse
import signal
import time

import torch

from rota.runtime import job_context, replica, replicas, report

stopping = False


def _stop(*_: object) -> None:
    global stopping
    stopping = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to serve")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    torch.manual_seed(args.seed)
    device = job_context().device()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(device).eval()
    served = 0
    deadline = time.monotonic() + args.seconds
    one = replica() is not None  # this process is one replica
    while not stopping and time.monotonic() < deadline:
        current = replicas()
        count = 1 if one or current is None else current.count
        with torch.no_grad():
            for _ in range(count):
                model(torch.randn(args.batch_size, 64, device=device)).argmax(dim=1)
                served += args.batch_size
        report(replicas=count, served=served, epoch=current.epoch if current else 0)
        time.sleep(1.0)
    print(f"served {served} requests", flush=True)


if __name__ == "__main__":
    main()
