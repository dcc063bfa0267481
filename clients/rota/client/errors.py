"""Typed SDK exceptions, one per gRPC status a caller may want to handle."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc


class RotaError(Exception):
    """A failed call. `code` is the gRPC status name; `field` names the bad field, if any;
    `detail`, when set, is more for a person, in lines of their own, that the one-line
    `message` sums up."""

    code = "UNKNOWN"

    def __init__(self, message: str, *, field: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.detail = detail


class InvalidArgumentError(RotaError):
    code = "INVALID_ARGUMENT"


class NotFoundError(RotaError):
    code = "NOT_FOUND"


class AlreadyExistsError(RotaError):
    code = "ALREADY_EXISTS"


class PermissionDeniedError(RotaError):
    code = "PERMISSION_DENIED"


class UnauthenticatedError(RotaError):
    code = "UNAUTHENTICATED"


class FailedPreconditionError(RotaError):
    code = "FAILED_PRECONDITION"


class UnavailableError(RotaError):
    code = "UNAVAILABLE"


class DeadlineExceededError(RotaError):
    code = "DEADLINE_EXCEEDED"


class UnimplementedError(RotaError):
    code = "UNIMPLEMENTED"


# By status code name: the HTTP client (rota.cli.http_submit) has names, not grpc's enum.
BY_CODE: dict[str, type[RotaError]] = {cls.code: cls for cls in (
    InvalidArgumentError, NotFoundError, AlreadyExistsError, PermissionDeniedError, UnauthenticatedError,
    FailedPreconditionError, UnavailableError, DeadlineExceededError, UnimplementedError,
)}


def error_of(code_name: str, message: str, field: str = "") -> RotaError:
    """The SDK's exception for a status code's name ("INVALID_ARGUMENT") and its message."""
    cls = BY_CODE.get(code_name, RotaError)
    error = cls(message or code_name, field=field)
    if cls is RotaError:
        error.code = code_name
    return error


def from_rpc_error(exc: grpc.RpcError) -> RotaError:
    code = exc.code()  # type: ignore[attr-defined]
    details = exc.details() or code.name  # type: ignore[attr-defined]
    field = ""
    metadata: Any = exc.trailing_metadata() or ()  # type: ignore[attr-defined]
    for key, value in metadata:
        if key == "rota-field":
            field = str(value)
    return error_of(code.name, details, field)
