"""The SDK speaks its own types: no rota.v1 proto (a `_pb2` type) in any public signature.

Walks rota.client's public API (every name in `rota.client.__all__`, and every SDK class a
public signature or field reaches from there): each public function's and method's
parameters and return, each dataclass field and each property. A proto there fails the
test naming where it appears; conversions live in the private `rota.client._wire` and in
the classes' private `_from_proto`.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

import rota.client
from rota.client import Client, Job, JobKind, JobSpec, JobState


def _resolved(owner: Any, obj: Callable[..., Any]) -> dict[str, Any]:
    """The annotations of a function, evaluated in its module with every SDK name (some are
    imported there under TYPE_CHECKING only)."""
    module = inspect.getmodule(obj) or inspect.getmodule(owner)
    import grpc

    namespace = {"grpc": grpc, **(vars(module) if module else {}), **_lazy_names()}
    return typing.get_type_hints(obj, globalns=namespace)


def _lazy_names() -> dict[str, Any]:
    names = {name: getattr(rota.client, name) for name in rota.client.__all__}
    import rota.client.forecast as forecast

    names.update({n: getattr(forecast, n) for n in ("DemandForecast", "Forecast", "TrafficSample")})
    return names


def _leaves(annotation: Any) -> Iterator[Any]:
    """Every type an annotation names (through unions, generics, Optional, ...)."""
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _leaves(arg)


def _is_proto(t: Any) -> bool:
    return "_pb2" in getattr(t, "__module__", "") or "_pb2" in repr(t)


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        if isinstance(inspect.getattr_static(cls, name), property):
            yield name, inspect.getattr_static(cls, name).fget
        elif inspect.isfunction(member) or inspect.ismethod(member):
            yield name, member


def _public_api() -> Iterator[tuple[str, Any]]:
    """(where, annotation) of every public signature reachable from rota.client.__all__."""
    seen: set[Any] = set()
    todo: list[Any] = [getattr(rota.client, name) for name in rota.client.__all__]
    todo += list(_lazy_names().values())
    while todo:
        obj = todo.pop()
        if obj in seen or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not getattr(obj, "__module__", "").startswith("rota.client"):
            continue
        seen.add(obj)
        found: list[tuple[str, Any]] = []
        if inspect.isfunction(obj):
            found += [(f"{obj.__qualname__}({name})", hint) for name, hint in _resolved(obj, obj).items()]
        else:
            if dataclasses.is_dataclass(obj):
                hints = typing.get_type_hints(obj, globalns={**vars(inspect.getmodule(obj)), **_lazy_names()})
                found += [(f"{obj.__qualname__}.{f.name}", hints[f.name]) for f in dataclasses.fields(obj)]
            for name, fn in _members(obj):
                found += [(f"{obj.__qualname__}.{name}({arg})", hint) for arg, hint in _resolved(obj, fn).items()]
        for where, hint in found:
            yield where, hint
            todo += [t for t in _leaves(hint) if inspect.isclass(t)]


def test_no_proto_type_in_any_public_signature() -> None:
    found = list(_public_api())
    assert len(found) > 200, "the walk reached the API"  # Client's methods, every result's fields
    wheres = {w.split("(")[0].split(".")[0] for w, _ in found}
    assert {"Client", "Job", "JobSpec", "JobArray", "Forecast", "CheckpointImage", "Verdict"} <= wheres
    leaks = sorted({where for where, hint in found if any(_is_proto(t) for t in _leaves(hint))})
    assert not leaks, f"proto types in public signatures: {leaks}"


def test_the_walk_would_see_a_proto() -> None:
    """The check can fail: a function taking a proto is caught."""
    from rota.v1 import common_pb2

    def takes(spec: common_pb2.JobSpec) -> None: ...

    hints = typing.get_type_hints(takes, globalns={"common_pb2": common_pb2})
    assert any(_is_proto(t) for t in _leaves(hints["spec"]))


@pytest.mark.parametrize(("method", "spec_param"), [
    (Client.submit, "spec"), (Client.submit_array, "spec"), (Client.what_if, "spec"), (Client.forecast, "spec"),
])
def test_submissions_take_the_sdk_job_spec_and_keyword_only_options(method: Callable[..., Any], spec_param: str) -> None:
    signature = inspect.signature(method)
    hints = _resolved(Client, method)
    assert hints[spec_param] is JobSpec
    options = [p for name, p in signature.parameters.items() if name != "self"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in options), method.__name__
    assert all(hints.get(p.name) in (timedelta, timedelta | None) for p in options if "timeout" in p.name)


def test_a_job_is_read_with_the_sdk_types() -> None:
    hints = typing.get_type_hints(Job, globalns=vars(inspect.getmodule(Job)))
    assert (hints["state"], hints["kind"], hints["spec"]) == (JobState, JobKind, JobSpec)
