"""The web console's pure pieces: the plan and node grids from plain data, query parsing,
error mapping, the form token, and the routes over a fake gateway (no api, no socket)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from rota.client import Job, JobState, NotFoundError, PermissionDeniedError, UnauthenticatedError
from rota.client.arrays import JobArray
from rota.client.plan import Explanation
from rota.console.app import ConsoleApp
from rota.console.gateway import ArrayPage, Gateway, Part, Viewer, allowed_actions
from rota.console.grid import OTHER, job_colour, node_rows, plan_grid, progress_fraction, runs
from rota.console.params import (
    BadParameter,
    error_text,
    form_token,
    form_token_ok,
    http_status,
    job_filters,
    job_id,
)
from rota.console.views import Views, static_file
from rota.v1 import common_pb2

PLAN = {
    "epoch": 7, "created_at": "2026-01-01T00:00:00Z", "policy": "fast", "trigger": "arrival of j-aaa",
    "step_seconds": 30.0, "horizon": 4, "gpu_labels": ["node-1/0", "node-1/1"],
    "grid": [["j-aaa", "j-aaa", "", "*"], ["", "", "", ""]],
    "jobs": [{"job_id": "j-aaa"}], "figures": {"utilization": 0.375},
}


# --- grids -----------------------------------------------------------------------------------


def test_plan_grid_merges_a_rows_runs_and_keeps_the_columns() -> None:
    grid = plan_grid(PLAN)
    assert grid.steps == [0, 1, 2, 3]
    assert [r.label for r in grid.rows] == ["node-1/0", "node-1/1"]
    first = grid.rows[0].cells
    assert [(c.job, c.span) for c in first] == [("j-aaa", 2), ("", 1), (OTHER, 1)]
    assert sum(c.span for c in first) == 4 and [c.span for c in grid.rows[1].cells] == [4]
    assert grid.busy_cells == 3
    assert [j for j, _ in grid.legend] == ["j-aaa", OTHER]
    assert grid.to_dict()["rows"][0]["cells"][0] == {"job": "j-aaa", "colour": job_colour("j-aaa"), "span": 2}


def test_plan_grid_labels_rows_the_api_did_not_name_and_survives_an_empty_plan() -> None:
    grid = plan_grid({**PLAN, "gpu_labels": []})
    assert [r.label for r in grid.rows] == ["gpu 0", "gpu 1"]
    empty = plan_grid({"grid": [], "horizon": 3})
    assert empty.rows == [] and empty.steps == [0, 1, 2]


def test_the_plans_trigger_is_shown_as_the_allocator_masked_it_for_the_caller() -> None:
    # The owner of a job that left the plan reads its id (the allocator checked it is
    # theirs); the console must not mask it again for not being among the plan's jobs.
    assert plan_grid({**PLAN, "trigger": "completion of j-bbb", "jobs": []}).trigger == "completion of j-bbb"
    hidden = "arrival of another tenant's job"
    assert plan_grid({**PLAN, "trigger": hidden}).trigger == hidden


def test_job_colours_are_stable_and_idle_or_foreign_cells_are_plain() -> None:
    assert job_colour("j-aaa") == job_colour("j-aaa") != job_colour("j-aab")
    assert job_colour("j-aaa").startswith("hsl(")
    assert job_colour("") == "" and job_colour(OTHER) == "#c8c8c8"
    assert runs([]) == []


NODES = [{"name": "node-1", "health": "ALIVE", "labels": {"switch": "s1"}, "last_heartbeat": None,
          "gpus": [{"index": 0, "type": "a100", "job": "j-mine"}, {"index": 1, "type": "a100", "job": "j-theirs"},
                   {"index": 2, "type": "", "job": None}]}]


def test_a_tenant_sees_other_tenants_holders_as_a_star_and_the_admin_sees_all() -> None:
    (tenant,) = node_rows(NODES, {"j-mine"}, bad=[("node-1", 2)])
    assert [g.holder for g in tenant.gpus] == ["j-mine", OTHER, ""]
    assert [g.bad for g in tenant.gpus] == [False, False, True]
    assert tenant.busy == 2 and tenant.switch == "s1" and tenant.gpu_types == ["a100"]
    (admin,) = node_rows(NODES, None)
    assert [g.holder for g in admin.gpus] == ["j-mine", "j-theirs", ""]


def test_progress_fraction() -> None:
    assert progress_fraction({"step": 3, "total": 12}) == 0.25
    assert progress_fraction({"step": 30, "total": 12}) == 1.0
    assert progress_fraction({"step": 3}) is None and progress_fraction({"step": "x", "total": 3}) is None
    assert progress_fraction({"step": 1, "total": 0}) is None


def test_buttons_follow_the_state() -> None:
    assert allowed_actions(JobState.RUNNING) == ["cancel", "pause"]
    assert allowed_actions(JobState.PAUSED) == ["cancel", "resume"]
    assert allowed_actions(JobState.PENDING) == ["cancel"]
    assert allowed_actions(JobState.SUCCEEDED) == allowed_actions(JobState.CANCELLED) == []


# --- parameters and errors --------------------------------------------------------------------


def test_job_filters_parse_repeated_and_comma_separated_values() -> None:
    f = job_filters({"tenant": ["demo"], "state": ["running,pending", "RUNNING"], "kind": ["Training"], "limit": ["50"]})
    assert (f.tenant, f.states, f.kinds, f.limit) == ("demo", ("RUNNING", "PENDING"), ("training",), 50)
    assert f.query() == "tenant=demo&state=RUNNING&state=PENDING&kind=training"
    assert job_filters({"state": [""], "kind": [""]}).states == ()  # the form's "any"
    assert job_filters({}).limit == 200


@pytest.mark.parametrize(("query", "field"), [
    ({"state": ["NOPE"]}, "state"), ({"kind": ["gpu"]}, "kind"), ({"limit": ["0"]}, "limit"),
    ({"limit": ["ten"]}, "limit"), ({"tenant": ["a b"]}, "tenant"), ({"tenant": ["a", "b"]}, "tenant"),
    ({"sort": ["id"]}, "sort"),
])
def test_a_bad_filter_names_its_field(query: dict[str, list[str]], field: str) -> None:
    with pytest.raises(BadParameter) as caught:
        job_filters(query)
    assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")


def test_job_ids_from_the_path() -> None:
    assert job_id("j-1234567890") == "j-1234567890"
    for bad in ("", "j 1", "../x", "j-%00", "x" * 65):
        with pytest.raises(BadParameter):
            job_id(bad)


def test_api_errors_map_to_http_statuses() -> None:
    assert http_status("INVALID_ARGUMENT") == 400 and http_status("NOT_FOUND") == 404
    assert http_status("PERMISSION_DENIED") == 403 and http_status("UNAUTHENTICATED") == 401
    assert http_status("FAILED_PRECONDITION") == 409 and http_status("UNAVAILABLE") == 503
    assert http_status("SOMETHING_NEW") == 502
    assert error_text("INVALID_ARGUMENT", "must be positive", "gpus") == "INVALID_ARGUMENT: gpus: must be positive"
    assert error_text("INVALID_ARGUMENT", "gpus: must be positive", "gpus") == "INVALID_ARGUMENT: gpus: must be positive"


def test_the_form_token_belongs_to_its_session() -> None:
    assert form_token_ok("rt_a", form_token("rt_a"))
    assert not form_token_ok("rt_a", form_token("rt_b"))
    assert not form_token_ok("", form_token(""))
    assert not form_token_ok("rt_a", "")


def test_static_files_are_only_the_consoles_own() -> None:
    found = static_file("console.js")
    assert found is not None and found[1].startswith("text/javascript")
    assert static_file("../views.py") is None and static_file("console.py") is None and static_file(".x.css") is None


# --- routes over a fake gateway ----------------------------------------------------------------


def a_job(state: str = "RUNNING", job_id: str = "j-aaa") -> Job:
    proto = common_pb2.Job(id=job_id, state=common_pb2.JobState.Value(f"JOB_STATE_{state}"),
                           spec=common_pb2.JobSpec(name="n", tenant="demo", gpus=1, command=["python", "x.py"]))
    return Job._from_proto(proto)


@dataclass
class FakeGateway:
    tokens: dict[str, Viewer] = field(default_factory=lambda: {"rt_admin": Viewer(True), "rt_demo": Viewer(False, "demo")})
    acted: list[tuple[str, str, str]] = field(default_factory=list)
    refuse: Exception | None = None

    def viewer(self, token: str) -> Viewer:
        if token not in self.tokens:
            raise UnauthenticatedError("unknown or expired token")
        return self.tokens[token]

    def jobs(self, token: str, filters: Any) -> list[Job]:
        return [a_job()]

    def job(self, token: str, jid: str) -> Any:
        raise NotFoundError(f"job {jid} not found")

    def job_or_array(self, token: str, jid: str) -> Any:
        if jid != ARRAY.id:
            try:
                return self.job(token, jid)
            except NotFoundError:
                raise NotFoundError(f"job {jid} not found (nor an array of that id)") from None
        tasks = [a_job("RUNNING", f"{ARRAY.id}_0"), a_job("PENDING", f"{ARRAY.id}_1"), a_job("SUCCEEDED", f"{ARRAY.id}_2")]
        return ArrayPage(ARRAY, Part(Explanation(ARRAY.id, "array j-arr: 3 tasks\n1 wait for the array's %1 cap",
                                                 0, 0, "", 0, 0, 0)), tasks)

    def job_state(self, token: str, jid: str) -> dict[str, Any]:
        if jid != "j-aaa":
            raise NotFoundError(f"job {jid} not found")
        return {"id": jid, "state": "RUNNING"}

    def plan(self, token: str, viewer: Viewer) -> Any:
        return plan_grid(PLAN)

    def cluster(self, token: str, viewer: Viewer) -> Any:
        raise RuntimeError("boom: a bug")

    def act(self, token: str, jid: str, action: str) -> str:
        if self.refuse is not None:
            raise self.refuse
        self.acted.append((token, jid, action))
        return f"{jid} is CANCELLED"


ARRAY = JobArray(id="j-arr", tenant="demo", name="sweep", count=3, max_running=1,
                 job_ids=[f"j-arr_{i}" for i in range(3)], states={"RUNNING": 1, "PENDING": 1, "SUCCEEDED": 1})


def app(gateway: FakeGateway | None = None) -> ConsoleApp:
    return ConsoleApp(gateway or FakeGateway(), Views())  # type: ignore[arg-type]


BEARER = {"Authorization": "Bearer rt_admin"}
COOKIE = {"Cookie": "other=1; rota_token=rt_demo", "Host": "console:8080"}


def test_without_a_token_pages_go_to_the_login_and_json_is_a_401() -> None:
    page = app().handle("GET", "/jobs?state=RUNNING", {})
    assert page.status == 303 and page.headers["Location"] == "/login?next=/jobs"
    assert app().handle("GET", "/plan.json", {}).status == 401
    assert app().handle("GET", "/healthz", {}).body == b"ok\n"
    assert b"<form" in app().handle("GET", "/login", {}).body


def test_login_sets_an_httponly_same_site_cookie_and_refuses_a_bad_token() -> None:
    ok = app().handle("POST", "/login", {}, b"token=rt_demo&next=%2Fplan")
    assert ok.status == 303 and ok.headers["Location"] == "/plan"
    cookie = ok.headers["Set-Cookie"]
    assert cookie.startswith("rota_token=rt_demo;") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert app().handle("POST", "/login", {}, b"token=rt_demo&next=https%3A%2F%2Fevil").headers["Location"] == "/"
    refused = app().handle("POST", "/login", {}, b"token=rt_wrong")
    assert refused.status == 401 and b"unknown or expired token" in refused.body
    assert app().handle("POST", "/login", {}, b"token=").status == 400


def test_parameters_and_api_refusals_become_statuses_never_tracebacks() -> None:
    bad = app().handle("GET", "/jobs?state=NOPE", BEARER)
    assert bad.status == 400 and b'"field": "state"' in bad.body
    missing = app().handle("GET", "/jobs/j-zzz.json", BEARER)
    assert missing.status == 404 and b"job j-zzz not found" in missing.body
    assert app().handle("GET", "/jobs/a%20b", COOKIE).status == 400
    broken = app().handle("GET", "/", COOKIE)
    assert broken.status == 500 and b"boom" not in broken.body and b"Traceback" not in broken.body
    assert app().handle("GET", "/nowhere", COOKIE).status == 404
    assert app().handle("POST", "/plan", COOKIE).status == 405


def test_pages_render_for_a_tenant() -> None:
    jobs = app().handle("GET", "/jobs", COOKIE)
    assert jobs.status == 200 and b"j-aaa" in jobs.body and b"demo (tenant)" in jobs.body
    assert jobs.headers["Cache-Control"] == "no-store"
    plan = app().handle("GET", "/plan.json", COOKIE)
    assert plan.status == 200 and b'"epoch": 7' in plan.body


def test_an_action_needs_the_sessions_form_token_and_shows_the_apis_refusal() -> None:
    gateway = FakeGateway()
    assert app(gateway).handle("POST", "/jobs/j-aaa/cancel", COOKIE, b"").status == 403
    forged = app(gateway).handle("POST", "/jobs/j-aaa/cancel", {**COOKIE, "Origin": "http://evil"},
                                 f"csrf={form_token('rt_demo')}".encode())
    assert forged.status == 403 and gateway.acted == []
    done = app(gateway).handle("POST", "/jobs/j-aaa/cancel", {**COOKIE, "Origin": "http://console:8080"},
                               f"csrf={form_token('rt_demo')}".encode())
    assert done.status == 303 and done.headers["Location"].startswith("/jobs/j-aaa?said=")
    assert gateway.acted == [("rt_demo", "j-aaa", "cancel")]
    assert app(gateway).handle("GET", "/jobs/j-aaa/cancel", COOKIE).status == 405
    assert app(gateway).handle("POST", "/jobs/j-aaa/cancel", BEARER).status == 200  # a script: no form token

    gateway.refuse = PermissionDeniedError("this call needs the admin token")
    refused = app(gateway).handle("POST", "/jobs/j-aaa/pause", COOKIE, f"csrf={form_token('rt_demo')}".encode())
    assert refused.status == 403 and b"this call needs the admin token" in refused.body


def test_console_times_carry_their_zone_as_the_cli_writes_them() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from rota.console.views import when

    assert when(datetime(2026, 12, 1, 16, 58, 54, tzinfo=UTC)) == "2026-12-01T16:58:54Z"
    assert when(datetime(2026, 12, 1, 17, 58, 54, tzinfo=timezone(timedelta(hours=1)))) == "2026-12-01T16:58:54Z"
    assert when(None) == "-"


def test_an_agentic_batch_an_overlap_plan_and_bubbles_get_panels_of_their_own() -> None:
    from rota.console.grid import progress_panels

    assert progress_panels({"step": 3, "loss": 2.0}) == []
    panels = {p.id: dict(p.rows) for p in progress_panels({
        "window": 8, "active": 6, "held": 10, "usage": 0.91, "hit_rate": 0.62, "recompute_ratio": 0.05,
        "agents_done": 4, "agents": 24, "tokens_per_s": 812.5, "signal": "increase",
        "overlap_plan": "tile2+buckets", "overlap_k": 2, "overlap_buckets": 3, "predicted_step_s": 0.02,
        "step_s": 0.025, "predicted_peak_mb": 2.75, "bubble_s": 0.01,
    })}
    assert panels["admission"]["Window"] == "8 agents (6 active, 10 held)"
    assert panels["admission"]["KV cache usage"] == "91%" and panels["admission"]["Agents done"] == "4 of 24"
    assert panels["overlap"]["Predicted step"] == "0.02 s (measured 0.025 s, +25%)"
    assert panels["bubbles"]["In bubbles"] == "0.01 s (40% of the step)"


def job_page(**fields: Any) -> Any:
    """The console's page of a_job() with `fields` changed (its other parts unavailable)."""
    import dataclasses

    from rota.console.gateway import JobPage, Part

    job = dataclasses.replace(a_job(), **fields)
    missing = Part(None, "UNAVAILABLE: not in this test")

    class WithJob(FakeGateway):
        def job(self, token: str, jid: str) -> JobPage:
            return JobPage(job, missing, missing, missing, missing, missing)

    page = app(WithJob()).handle("GET", "/jobs/j-aaa", COOKIE)
    assert page.status == 200, page.body[:300]
    return page


def test_the_job_page_shows_an_agentic_batch_s_admission_panel() -> None:
    page = job_page(progress={"window": 8, "active": 6, "held": 2, "usage": 0.5, "hit_rate": 0.7})
    assert b'<table class="facts" id="admission">' in page.body and b"8 agents (6 active, 2 held)" in page.body
    assert b'id="overlap"' not in page.body


def test_the_job_page_of_a_guest_names_the_pipeline_whose_bubbles_it_runs_in() -> None:
    page = job_page(kind="trial", node="node-1", gpus=[0], guest_of="j-pipe")
    assert b'id="guests"' not in page.body
    host = job_page(guests=["j-t1", "j-t2"])
    assert b'<a href="/jobs/j-t1">j-t1</a>, <a href="/jobs/j-t2">j-t2</a> (trials in its pipeline bubbles)' in host.body
    assert b'a guest in the pipeline bubbles of <a href="/jobs/j-pipe">j-pipe</a>' in page.body


def test_the_job_page_lists_checkpoint_operations_with_a_streamed_migration_and_its_times() -> None:
    from datetime import UTC, datetime, timedelta

    from rota.client.checkpoint import CheckpointImage, CheckpointOperation, JobImages
    from rota.console.gateway import JobPage, Part

    at = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
    image = CheckpointImage("img-1", 2, "pause", "complete", "node-1", 1, 40, 13 << 20, 9 << 20, 13 << 20, 4,
                            0.05, 3.2, at, "")
    moved = CheckpointOperation(7, "allocator-1", "migrate", "done", "node-2", "img-1", "", at,
                                at + timedelta(seconds=3.5), streamed=True, source_node="node-1", pause_seconds=0.12,
                                write_seconds=3.2)
    failed = CheckpointOperation(8, "", "pause", "failed", "", "img-2", "ranks [1] of 2 did not reach a safe point",
                                 at, None, source_node="node-2")
    missing = Part(None, "UNAVAILABLE: not in this test")

    class WithImages(FakeGateway):
        def job(self, token: str, jid: str) -> JobPage:
            return JobPage(a_job(), missing, missing, Part(JobImages("j-aaa", [image], [moved, failed])), missing,
                           missing)

    page = app(WithImages()).handle("GET", "/jobs/j-aaa", COOKIE)
    assert page.status == 200, page.body[:300]
    body = page.body.decode()
    table = body[body.index('<table class="operations">'):]
    assert "<td>migrate</td><td>done</td><td>node-1</td><td>node-2</td>" in table and "<td>yes</td>" in table
    assert "<td>0.12 s</td>" in table and "<td>3.20 s</td>" in table and "<td>3.50 s</td>" in table
    assert "did not reach a safe point" in table and table.count("<td>yes</td>") == 1


def test_an_array_id_has_a_page_its_tasks_by_state_each_linking_to_its_own() -> None:
    page = app().handle("GET", "/jobs/j-arr", COOKIE)
    assert page.status == 200
    body = page.body.decode()
    for i in range(3):
        assert f'href="/jobs/j-arr_{i}"' in body
    assert body.index('data-state="RUNNING"') < body.index('data-state="PENDING"') < body.index('data-state="SUCCEEDED"')
    assert "wait for the array&#39;s %1 cap" in body and 'id="cancel-button"' in body
    missing = app().handle("GET", "/jobs/j-zzz", COOKIE)
    assert missing.status == 404 and b"nor an array" in missing.body


class FakeClient:
    """What Gateway.job_or_array asks of the SDK: one job, one array, one explanation."""

    def get_job(self, job_id: str) -> Job:
        if not job_id.startswith("j-arr_"):
            raise NotFoundError(f"job {job_id} not found")
        return a_job("PENDING" if job_id.endswith("_1") else "RUNNING", job_id)

    def get_array(self, array_id: str) -> JobArray:
        if array_id != ARRAY.id:
            raise NotFoundError(f"job array {array_id} not found")
        return ARRAY

    def explain(self, job_id: str) -> Explanation:
        return Explanation(job_id, "array j-arr: 3 tasks", 0, 0, "", 0, 0, 0)


def test_the_gateway_answers_an_array_id_with_its_page_and_neither_with_not_found() -> None:
    gateway = Gateway(None, timedelta(seconds=5))  # type: ignore[arg-type]
    gateway.client = lambda token: FakeClient()  # type: ignore[assignment,method-assign,return-value]
    page = gateway.job_or_array("rt_demo", "j-arr")
    assert isinstance(page, ArrayPage) and page.explanation.value.reason == "array j-arr: 3 tasks"
    assert [(s, [t.id for t in ts]) for s, ts in page.by_state] == [("RUNNING", ["j-arr_0", "j-arr_2"]),
                                                                     ("PENDING", ["j-arr_1"])]
    with pytest.raises(NotFoundError, match="nor an array"):
        gateway.job_or_array("rt_demo", "j-zzz")


@pytest.mark.parametrize(("fairness", "state", "deserved", "used", "says"), [
    (None, "PAUSED", 1.0, 1.0, "F = n/a: a paused job is not runnable"),
    (None, "CANCELLED", 0.0, 0.0, "F = n/a: it has not demanded GPUs"),
    (None, "PENDING", 0.5, 0.0, "F = n/a: it has not run"),
    (0.5, "RUNNING", 2.0, 1.0, "F = 0.50 (under-served)"),
])
def test_a_jobs_fairness_reads_n_a_where_f_does_not_apply(
    fairness: float | None, state: str, deserved: float, used: float, says: str,
) -> None:
    from rota.client.ledger import JobFairness
    from rota.console.gateway import JobPage

    figures = JobFairness("j-aaa", "demo", state, 1, deserved, used, fairness, None)
    missing = Part(None, "UNAVAILABLE: not in this test")

    class WithFairness(FakeGateway):
        def job(self, token: str, jid: str) -> JobPage:
            return JobPage(a_job(state), missing, missing, missing, missing, Part([figures]))

    body = app(WithFairness()).handle("GET", "/jobs/j-aaa", COOKIE).body.decode().replace("&#39;", "'")
    assert says in body
