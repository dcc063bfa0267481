"""ForecasterService over gRPC on a real PostgreSQL, driven through the SDK.

A fresh database for the module (the models learn from every completion in it); the
server runs with the real interceptor (tokens, errors to status codes) on a loopback port.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from opentelemetry import trace

from rota.api import repository as api
from rota.client import Client, InvalidArgumentError, JobSpec, NotFoundError, job_spec_from_mapping
from rota.client._wire import spec_to_proto  # Observe is a raw RPC the SDK does not send
from rota.client.forecast import TrafficSample
from rota.cluster import submissions
from rota.cluster.job_lifecycle import Events
from rota.common import convert
from rota.common.auth import hash_token
from rota.common.bootstrap import TokenAuthenticator
from rota.common.db import Database
from rota.common.server import RotaInterceptor
from rota.core.forecasting.features import parse_training
from rota.core.forecasting.prior import training_seconds
from rota.core.jobspec import JobSpecData, validate
from rota.forecaster.service import ForecasterService
from rota.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

ADMIN = "admin-" + secrets.token_hex(8)
NOW = 168 * 3600 * 3000  # a week boundary, so hour-of-week 0 is the first forecast hour
FEATURES: dict[str, Any] = {"variant": "lora-sft", "params": 1.3e9, "tokens": 2e8}


@pytest.fixture(scope="module")
def db(databases: Any) -> Iterator[Database]:
    with databases.migrated() as private:
        yield private


@pytest.fixture(scope="module")
def endpoint(db: Database) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        interceptor = RotaInterceptor(tracer=trace.get_tracer("test"), authenticate=TokenAuthenticator(ADMIN, db),
                                      default_deadline_s=20)
        server = grpc.aio.server(interceptors=[interceptor])
        forecaster_pb2_grpc.add_ForecasterServiceServicer_to_server(ForecasterService(db, now=lambda: NOW), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    yield f"127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


@pytest.fixture
def client(endpoint: str) -> Iterator[Client]:
    with Client.connect(endpoint, token=ADMIN, timeout=timedelta(seconds=20)) as c:
        yield c


def tenant_token(db: Database) -> str:
    token = "t_" + secrets.token_hex(12)
    db.run(lambda s: api.create_tenant(s, "t-" + secrets.token_hex(4), 1.0, hash_token(token)))
    return token


def spec(**fields: Any) -> JobSpec:
    return job_spec_from_mapping({"kind": "training", "gpus": 2, "command": ["true"], "features": FEATURES, **fields})


def wire_spec(**fields: Any) -> common_pb2.JobSpec:
    """The spec as the forecaster's Observe takes it (a raw RPC the SDK does not send)."""
    return spec_to_proto(spec(**fields))


def observe(endpoint: str, request: forecaster_pb2.ObserveRequest, token: str = ADMIN) -> bool:
    with grpc.insecure_channel(endpoint) as channel:
        reply = forecaster_pb2_grpc.ForecasterServiceStub(channel).Observe(
            request, metadata=(("authorization", f"Bearer {token}"),), timeout=20)
    return bool(reply.recorded)


def test_a_forecast_before_any_completion_is_the_prior_with_its_interval(client: Client) -> None:
    f = client.forecast(spec=spec())
    prior = training_seconds(parse_training(FEATURES, 2))
    assert (f.model, f.observations) == ("prior", 0)
    assert f.p50_seconds == pytest.approx(prior) and f.prior_seconds == pytest.approx(prior)
    assert f.p10_seconds < f.p50_seconds < f.p90_seconds
    assert f.gpu_hours_p50 == pytest.approx(f.p50_seconds * 2 / 3600)
    assert client.forecast(spec=spec(), quantile=0.9).seconds == pytest.approx(f.p90_seconds)


def test_a_bad_feature_or_quantile_is_an_invalid_argument_naming_the_field(client: Client) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        client.forecast(spec=spec(features={"variant": "lora-sft", "params": 1e9}))
    assert err.value.field == "features.tokens"
    with pytest.raises(InvalidArgumentError) as err:
        client.forecast(spec=spec(), quantile=1.5)
    assert err.value.field == "quantile"


def test_completions_recalibrate_the_model_and_are_idempotent(client: Client, endpoint: str) -> None:
    # 30 imported completions that each took exactly three times the prior.
    for i in range(30):
        features = {**FEATURES, "tokens": 1e7 * (i + 1)}
        seconds = 3 * training_seconds(parse_training(features, 2))
        request = forecaster_pb2.ObserveRequest(key=f"import-{i}", job_id=f"old-{i}", duration_seconds=seconds,
                                                spec=wire_spec(features=features))
        assert observe(endpoint, request) is True
    assert observe(endpoint, forecaster_pb2.ObserveRequest(key="import-0", job_id="old-0", duration_seconds=1.0,
                                                           spec=wire_spec())) is False
    f = client.forecast(spec=spec())
    assert (f.model, f.observations) == ("learned", 30)
    assert f.p50_seconds == pytest.approx(3 * f.prior_seconds, rel=0.02)


def test_a_completion_of_a_known_job_uses_its_stored_spec(db: Database, endpoint: str) -> None:
    name = "t-" + secrets.token_hex(4)
    db.run(lambda s: api.create_tenant(s, name, 1.0, secrets.token_hex(32)))
    data = validate(JobSpecData(tenant=name, kind="batch_inference", priority=5, gpus=1, command=["true"],
                                duration_seconds=600.0), max_gpus_per_node=0)
    job, _ = db.run(lambda s: submissions.submit_job(s, data, "", Events()))
    assert observe(endpoint, forecaster_pb2.ObserveRequest(job_id=job.id, duration_seconds=900.0)) is True
    assert observe(endpoint, forecaster_pb2.ObserveRequest(job_id=job.id, duration_seconds=900.0)) is False
    with pytest.raises(grpc.RpcError) as err:
        observe(endpoint, forecaster_pb2.ObserveRequest(job_id="no-such-job", duration_seconds=5.0))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_tenants_may_push_traffic_but_not_record_completions(db: Database, endpoint: str) -> None:
    token = tenant_token(db)
    assert observe(endpoint, forecaster_pb2.ObserveRequest(app="tenant-app", requests=3, at_unix=NOW - 60), token)
    with pytest.raises(grpc.RpcError) as err:
        observe(endpoint, forecaster_pb2.ObserveRequest(job_id="x", duration_seconds=5.0, spec=wire_spec()), token)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(("request_fields", "code", "field"), [
    ({}, grpc.StatusCode.INVALID_ARGUMENT, "job_id"),
    ({"job_id": "a", "app": "b"}, grpc.StatusCode.INVALID_ARGUMENT, "app"),
    ({"app": "b", "requests": -1, "at_unix": NOW}, grpc.StatusCode.INVALID_ARGUMENT, "requests"),
    ({"app": "b", "requests": 1}, grpc.StatusCode.INVALID_ARGUMENT, "at_unix"),
    ({"job_id": "a", "duration_seconds": 0}, grpc.StatusCode.INVALID_ARGUMENT, "duration_seconds"),
])
def test_a_malformed_observation_is_refused_naming_the_field(endpoint: str, request_fields: dict[str, Any],
                                                             code: grpc.StatusCode, field: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        observe(endpoint, forecaster_pb2.ObserveRequest(**request_fields))
    assert err.value.code() == code
    assert dict(err.value.trailing_metadata() or ()).get("rota-field") == field


def test_pushed_weekly_traffic_becomes_a_gpu_curve_under_the_swap_cap(client: Client) -> None:
    app = "chat-" + secrets.token_hex(3)
    start = NOW - 3 * 168 * 3600  # three exact weeks: 100 requests/hour, 400 from 08:00 to 11:59 every day
    samples = [TrafficSample(start + h * 3600, 400.0 if 8 <= h % 24 < 12 else 100.0) for h in range(3 * 168)]
    assert client.push_traffic(app=app, samples=samples) == len(samples)
    assert client.push_traffic(app=app, samples=samples[:5]) == 0  # re-pushing changes nothing
    curve = client.demand_curve(app=app, horizon=24, capacity=100.0, max_swap=1)
    assert curve.start_unix == NOW and curve.history_hours == len(samples)
    assert curve.traffic == pytest.approx([400.0 if 8 <= h < 12 else 100.0 for h in range(24)], rel=1e-6)
    # 1 GPU, rising one a step from 06:00 to reach 4 at 08:00, falling one a step from 12:00.
    assert curve.gpus == [1, 1, 1, 1, 1, 1, 2, 3, 4, 4, 4, 4, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert curve.lower[8] <= 4 <= curve.upper[8]


def test_a_demand_curve_needs_a_capacity_and_some_traffic(client: Client) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        client.demand_curve(app="unknown-app")
    assert err.value.field == "capacity"
    with pytest.raises(NotFoundError):
        client.demand_curve(app="unknown-app", capacity=10.0)


def test_tenant_tokens_may_forecast(db: Database, endpoint: str) -> None:
    with Client.connect(endpoint, token=tenant_token(db)) as c:
        assert c.forecast(spec=spec()).p50_seconds > 0
        with pytest.raises(InvalidArgumentError) as err:
            c.forecast(spec=spec(kind="realtime", features={}))
        assert err.value.field == "kind"


def test_a_job_that_ran_before_is_forecast_from_its_own_runs(db: Database, endpoint: str) -> None:
    # Two runs of one job file (7 s each, recorded from the cluster's jobs as the collector
    # does): the next submission of it is forecast from them, not from its 2-minute promise.
    token = "t_" + secrets.token_hex(12)
    tenant = "t-" + secrets.token_hex(4)
    db.run(lambda s: api.create_tenant(s, tenant, 1.0, hash_token(token)))
    job_file = {"name": "train-small", "kind": "training", "gpus": 1, "priority": 5, "workdir": "/tmp",
                "command": ["python", "train.py"], "duration": "2m"}
    mine = job_spec_from_mapping(job_file)
    stored = convert.spec_from_proto(spec_to_proto(mine))  # as the api receives and stores it
    stored.tenant = tenant
    data = validate(stored, max_gpus_per_node=0)
    for _ in range(2):
        job, _ = db.run(lambda s: submissions.submit_job(s, data, "", Events()))
        assert observe(endpoint, forecaster_pb2.ObserveRequest(job_id=job.id, duration_seconds=7.0)) is True
    with Client.connect(endpoint, token=token, timeout=timedelta(seconds=20)) as c:
        f = c.forecast(spec=mine)
        assert f.model == "own-runs" and f.p50_seconds == pytest.approx(7.0)
        assert 7.0 < f.p90_seconds < 2.5 * 7.0  # two runs: wide, but seconds, not minutes
        assert c.forecast(spec=job_spec_from_mapping({**job_file, "name": "never-ran"})).model != "own-runs"
    with Client.connect(endpoint, token=tenant_token(db), timeout=timedelta(seconds=20)) as c:
        assert c.forecast(spec=mine).model != "own-runs"  # another tenant's job of the same name
