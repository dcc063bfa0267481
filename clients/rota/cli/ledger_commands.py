"""`rota usage` and `rota fairness`: the GPU-time ledger from the command line (docs/design.md §4).

Both show raw GPU-hours and GPU-hours weighted by GPU type (what fairness counts).
"""

from __future__ import annotations

import argparse
import math
import re
from datetime import UTC, datetime, timedelta

from rota.cli.commands import connect
from rota.cli.flags import one_of
from rota.cli.output import print_json, table
from rota.client import parse_duration
from rota.client.errors import InvalidArgumentError
from rota.client.ledger import fairness_text, policy_text

_DAYS = re.compile(r"^\s*(\d+(?:\.\d+)?)d(.*)$")
HEADERS = {"job": ("JOB", "TENANT"), "tenant": ("TENANT",), "user": ("USER", "TENANT"), "day": ("DAY (UTC)",),
           "gpu": ("GPU",)}


def parse_since(value: str, now: datetime | None = None) -> datetime | None:
    """`--since`: an ISO time (UTC when it has no zone) or a span back from now (7d, 24h, 1d12h)."""
    if not value:
        return None
    now = now or datetime.now(UTC)
    match = _DAYS.match(value)
    try:
        if match:
            rest = match.group(2).strip()
            return now - timedelta(days=float(match.group(1)), seconds=parse_duration(rest) if rest else 0.0)
        return now - timedelta(seconds=parse_duration(value))
    except InvalidArgumentError:
        pass
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since: cannot read {value!r} as an ISO time or a span such as 7d or 24h") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _hours(x: float) -> str:
    """At least two decimals and four significant digits: a minute on one GPU is 0.01667
    GPU-hours, a second 0.0002778, where two decimals would show both as 0.00."""
    if x == 0 or not math.isfinite(x):
        return f"{x:.2f}"
    decimals = min(9, max(2, 3 - math.floor(math.log10(abs(x)))))
    return f"{x:.{decimals}f}"


def usage(args: argparse.Namespace) -> int:
    args.by = one_of("--by", "grouping", args.by, tuple(HEADERS))
    since = parse_since(args.since)
    with connect(args) as client:
        rows = client.usage(tenant=args.tenant, since=since, by=args.by)
    total = sum(r.gpu_hours for r in rows)
    weighted = sum(r.weighted_gpu_hours for r in rows)
    if args.json:
        print_json({"by": args.by, "since": since.isoformat() if since else None,
                    "rows": [r.to_dict() for r in rows], "total_gpu_hours": total,
                    "total_weighted_gpu_hours": weighted})
        return 0
    with_tenant = args.by in ("job", "user")
    body = [[r.key, *([r.tenant] if with_tenant else []), _hours(r.gpu_hours), _hours(r.weighted_gpu_hours)]
            for r in rows]
    blank = [""] if with_tenant else []
    print(table([*HEADERS.get(args.by, ("KEY",)), "GPU-H", "WEIGHTED GPU-H"],
                [*body, ["total", *blank, _hours(total), _hours(weighted)]]))
    return 0


def fairness(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if args.jobs:
            jobs = client.job_fairness(tenant=args.tenant)
            if args.json:
                print_json({"jobs": [j.to_dict() for j in jobs]})
                return 0
            print(table(
                ["JOB", "TENANT", "STATE", "GPUS", "DESERVED", "USED", "RAW USED", "F"],
                [[j.job_id, j.tenant, j.state, j.gpus, _hours(j.deserved), _hours(j.used), _hours(j.raw_used),
                  fairness_text(j.fairness)] for j in jobs],
            ))
            return 0
        st = client.standings()
    tenants = [t for t in st.tenants if not args.tenant or t.tenant == args.tenant]
    if args.json:
        print_json({**st.to_dict(), "tenants": [t.to_dict() for t in tenants]})
        return 0
    start = st.window_start.isoformat(timespec="minutes") if st.window_start else "-"
    at = st.at.isoformat(timespec="minutes") if st.at else "-"
    print(f"window {start} .. {at}, {st.capacity_gpus} GPUs alive; GPU-hours, used weighted by GPU type;"
          " F = used / deserved (n/a: no demand in the window)")
    print(policy_text(st.policy, st.lease_seconds))
    print(table(
        ["TENANT", "SHARE", "QUOTA", "ENTITLED", "DESERVED", "USED", "RAW USED", "F"],
        [[t.tenant, f"{t.share:g}", t.quota, _hours(t.entitled), _hours(t.deserved), _hours(t.used),
          _hours(t.raw_used), fairness_text(t.fairness)] for t in tenants],
    ))
    return 0


def usage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", default="", help="only this tenant (a tenant token sees only its own)")
    parser.add_argument("--since", default="", help="ISO time (UTC if no zone) or a span back from now: 7d, 24h")
    parser.add_argument("--by", default="tenant", help="job | tenant | user | day | gpu (default: tenant)")


def fairness_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", action="store_true", help="per-job F instead of per tenant")
    parser.add_argument("--tenant", default="", help="only this tenant")
