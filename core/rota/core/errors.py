"""Domain errors raised by cores and repositories; `rota.common.server` maps them to gRPC codes."""

from __future__ import annotations


class DomainError(Exception):
    code_name = "INTERNAL"

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class InvalidArgument(DomainError):
    """Bad input. `field` names the offending field; the message starts with it."""

    code_name = "INVALID_ARGUMENT"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}", field=field)
        self.reason = reason


class NotFound(DomainError):
    code_name = "NOT_FOUND"


class AlreadyExists(DomainError):
    code_name = "ALREADY_EXISTS"


class PermissionDenied(DomainError):
    code_name = "PERMISSION_DENIED"


class Unauthenticated(DomainError):
    code_name = "UNAUTHENTICATED"


class FailedPrecondition(DomainError):
    code_name = "FAILED_PRECONDITION"


class Unavailable(DomainError):
    code_name = "UNAVAILABLE"
