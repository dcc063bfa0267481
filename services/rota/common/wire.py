"""Checks every request gets before any handler sees it, whatever the service.

PostgreSQL text cannot hold a NUL character, and no Rota name, id or command needs one:
a NUL anywhere in a request is refused up front, naming the field, instead of failing
deep inside a transaction.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from rota.core.errors import InvalidArgument


def reject_nul(message: Any, prefix: str = "") -> None:
    """Raises InvalidArgument naming the first string field (at any depth) holding a NUL."""
    if not isinstance(message, Message):
        return  # forwarded bytes: the owning service checks them
    for field, value in message.ListFields():
        name = f"{prefix}{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key, item in value.items():
                _check(f"{name}.{key}" if isinstance(key, str) and "\x00" not in key else name, key)
                _check_value(f"{name}.{key}", item, field.message_type.fields_by_name["value"])
        elif field.is_repeated:
            for i, item in enumerate(value):
                _check_value(f"{name}[{i}]", item, field)
        else:
            _check_value(name, value, field)


def _check_value(name: str, value: Any, field: FieldDescriptor) -> None:
    if field.message_type is not None:
        reject_nul(value, f"{name}.")
    else:
        _check(name, value)


def _check(name: str, value: Any) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise InvalidArgument(name, "must not contain NUL characters")
