"""`rota tenants` (quotas) and `rota users`: a tenant's quota and its users with their own tokens."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from rota.cli.commands import connect
from rota.cli.output import print_json, table
from rota.client import Tenant, User, parse_duration


def gpu_limits(values: list[str]) -> dict[str, int]:
    """--gpu-limit TYPE=N (repeatable) as {type: N}; SystemExit naming the flag otherwise."""
    out: dict[str, int] = {}
    for value in values:
        name, _, count = value.partition("=")
        if not name or not count.strip().lstrip("-").isdigit():
            raise SystemExit(f"rota: --gpu-limit: expected TYPE=N (e.g. a100=4), got {value!r}")
        out[name.strip()] = int(count)
    return out


def quota_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--guaranteed", type=int, default=0, metavar="G",
                   help="GPUs guaranteed: reclaimed from borrowers within the reclaim bound (docs/tenants.md)")
    p.add_argument("--limit", type=int, default=None, metavar="L", help="the most GPUs it (with its subtree) holds")
    p.add_argument("--parent", default="", help="the tenant above it (a department over its groups)")
    p.add_argument("--gpu-limit", action="append", default=[], metavar="TYPE=N",
                   help="the most GPUs of one type it holds (repeatable)")


def tenant_row(t: Tenant) -> dict[str, object]:
    return {"name": t.name, "share": t.share, "guaranteed": t.guaranteed, "limit": t.limit,
            "gpu_limits": t.gpu_limits, "parent": t.parent or None, "in_use": t.in_use, "borrowed": t.borrowed,
            "token_expires_at": _iso(t.token_expires_at)}


def tenants_table(found: list[Tenant]) -> str:
    rows = [(t.name, f"{t.share:g}", t.parent or "-", t.guaranteed, "-" if t.limit is None else t.limit,
             ",".join(f"{k}={v}" for k, v in sorted(t.gpu_limits.items())) or "-", t.in_use, t.borrowed,
             _expiry_text(t.token_expires_at)) for t in found]
    return table(("TENANT", "SHARE", "PARENT", "GUARANTEED", "LIMIT", "GPU LIMITS", "IN USE", "BORROWED", "TOKEN"), rows)


def set_quota(args: argparse.Namespace) -> int:
    """`rota tenants quota NAME --guaranteed G --limit L`: replaces the tenant's quota (admin)."""
    with connect(args) as client:
        tenant = client.set_tenant_quota(args.name, guaranteed=args.guaranteed, limit=args.limit,
                                         gpu_limits=gpu_limits(args.gpu_limit), parent=args.parent)
    if args.json:
        print_json(tenant_row(tenant))
    else:
        print(tenants_table([tenant]))
    return 0


def users_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", default="", help="the tenant (the admin token must name it; default: the caller's)")


def user_name_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    users_arguments(p)


def user_add_arguments(p: argparse.ArgumentParser) -> None:
    user_name_arguments(p)
    p.add_argument("--tenant-admin", action="store_true", help="may manage the tenant's users and all its jobs")
    p.add_argument("--token-ttl", default="", metavar="DURATION", help="how long its token is valid (e.g. 720h)")


def user_token_arguments(p: argparse.ArgumentParser) -> None:
    user_name_arguments(p)
    p.add_argument("--ttl", default="", metavar="DURATION", help="how long the new token is valid (e.g. 720h)")


def users(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if args.users_command == "add":
            ttl = _ttl(args.token_ttl, "--token-ttl")
            user, token = client.create_user(args.name, tenant=args.tenant, tenant_admin=args.tenant_admin, token_ttl=ttl)
            return _with_token(args, user, token, f"user {user.name} of tenant {user.tenant} created")
        if args.users_command == "token":
            user, token = client.issue_user_token(args.name, tenant=args.tenant, ttl=_ttl(args.ttl, "--ttl"))
            return _with_token(args, user, token, f"user {user.name} has a new token; the old one no longer works")
        if args.users_command == "revoke":
            found = [client.revoke_user(args.name, tenant=args.tenant)]
        else:
            found = client.list_users(tenant=args.tenant)
    if args.json:
        print_json([_user_row(u) for u in found])
    else:
        print(table(("TENANT", "USER", "ROLE", "TOKEN", "LAST USED", "REVOKED"),
                    [(u.tenant, u.name, "tenant admin" if u.tenant_admin else "user", _expiry_text(u.token_expires_at),
                      _iso(u.last_used_at) or "never", _iso(u.revoked_at) or "-") for u in found]))
    return 0


def _with_token(args: argparse.Namespace, user: User, token: str, done: str) -> int:
    if args.json:
        print_json({**_user_row(user), "token": token})
    else:
        print(f"{done}; its token (shown once, {_expiry_text(user.token_expires_at)}):\n{token}")
    return 0


def _user_row(u: User) -> dict[str, object]:
    return {"tenant": u.tenant, "name": u.name, "tenant_admin": u.tenant_admin,
            "token_expires_at": _iso(u.token_expires_at), "last_used_at": _iso(u.last_used_at),
            "revoked_at": _iso(u.revoked_at)}


def _ttl(text: str, flag: str) -> timedelta | None:
    return timedelta(seconds=parse_duration(text, flag)) if text else None


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.replace(tzinfo=UTC).isoformat(timespec="seconds")


def _expiry_text(at: datetime | None) -> str:
    return "does not expire" if at is None else f"expires {_iso(at)}"
