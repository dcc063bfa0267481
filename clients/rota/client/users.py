"""A tenant's users as the SDK returns them (`Client.create_user`, `list_users`, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from google.protobuf import timestamp_pb2

from rota.v1 import common_pb2


def _at(ts: timestamp_pb2.Timestamp, present: bool) -> datetime | None:
    return ts.ToDatetime() if present else None


@dataclass(frozen=True)
class User:
    tenant: str
    name: str
    tenant_admin: bool  # administers its tenant: its users and all its jobs
    created_at: datetime | None  # UTC, naive
    token_expires_at: datetime | None  # None: the token does not expire
    last_used_at: datetime | None  # None: never used (written at most once a minute)
    revoked_at: datetime | None  # set: its token is refused

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @staticmethod
    def _from_proto(u: common_pb2.User) -> User:
        return User(u.tenant, u.name, u.tenant_admin, _at(u.created_at, u.HasField("created_at")),
                    _at(u.token_expires_at, u.HasField("token_expires_at")),
                    _at(u.last_used_at, u.HasField("last_used_at")), _at(u.revoked_at, u.HasField("revoked_at")))
