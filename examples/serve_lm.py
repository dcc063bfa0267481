"""A realtime app: a small torch classifier answering generated requests on its replicas.

It polls `rota.runtime.replicas()` each second and serves one batch per replica per tick,
so when the allocator scales it (more or fewer GPUs), its throughput follows. It reports
`replicas`, `served` and `epoch`; SIGTERM ends it cleanly.
"""

from __future__ import annotations

import argparse
import signal
import time

import torch

from rota.runtime import job_context, replicas, report

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
    while not stopping and time.monotonic() < deadline:
        current = replicas()
        count = current.count if current else 1
        with torch.no_grad():
            for _ in range(count):
                model(torch.randn(args.batch_size, 64, device=device)).argmax(dim=1)
                served += args.batch_size
        report(replicas=count, served=served, epoch=current.epoch if current else 0)
        time.sleep(1.0)
    print(f"served {served} requests", flush=True)


if __name__ == "__main__":
    main()
