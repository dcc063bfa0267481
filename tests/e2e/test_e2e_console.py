"""The web console in a real browser: Debian's headless Chromium, driven by Playwright,
against a real local cluster (`rota up` starts the console and writes its URL into
cluster.json).

The admin logs in with the admin token, sees a submitted job listed, RUNNING and then
SUCCEEDED on its page (which follows the state by itself) and the plan grid with its cells.
A second tenant's token lists none of the first tenant's jobs, gets a 404 for one, and sees
its GPUs and plan cells as `*`, and its cancel, pause and resume POSTs on the job get
the api's 404; the owner's cancel button cancels its job. An array has a page: its tasks
by state, each linking to its own page, and why the waiting ones wait. A screenshot of
each page goes to $ROTA_TEST_ARTIFACTS (default <repo>/.artifacts/console) and its path is
printed (`pytest -s` shows them).
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import REPO, RunningCluster, own_cluster

from rota.console.params import form_token

playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
CHROMIUM = os.environ.get("ROTA_TEST_CHROMIUM", "/usr/bin/chromium")
if not shutil.which(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)", allow_module_level=True)

expect = playwright.expect
ARTIFACTS = Path(os.environ.get("ROTA_TEST_ARTIFACTS") or REPO / ".artifacts") / "console"
SHORT = ["python", "examples/sleep_job.py", "--seconds", "8"]
LONG = ["python", "examples/sleep_job.py", "--seconds", "120"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, databases: Any, redis_url: str) -> Iterator[RunningCluster]:
    yield from own_cluster(tmp_path_factory, databases, redis_url, "console", nodes=2, gpus_per_node=2)


@pytest.fixture(scope="module")
def console(cluster: RunningCluster) -> str:
    url = cluster.info["console"]
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{url}/healthz", timeout=5) as reply:
        assert reply.read() == b"ok\n"
    return str(url)


@pytest.fixture(scope="module")
def tokens(cluster: RunningCluster) -> dict[str, str]:
    with cluster.client() as client:
        _, demo = client.issue_token("demo")
        _, other = client.create_tenant("other")
    return {"admin": cluster.token, "demo": demo, "other": other}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


def logged_in(browser: Any, console: str, token: str) -> Any:
    """A page of a fresh browser context (its own cookies) after logging in with `token`."""
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{console}/jobs")
    expect(page).to_have_url(f"{console}/login?next=/jobs")  # no token yet: the login form
    page.fill("input[name=token]", token)
    page.click("form.login button")
    expect(page).to_have_url(f"{console}/jobs")
    return page


def shot(page: Any, name: str) -> None:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"console screenshot: {path}")


def test_admin_sees_a_job_run_and_succeed_and_the_plan(
    cluster: RunningCluster, console: str, tokens: dict[str, str], browser: Any
) -> None:
    page = logged_in(browser, console, tokens["admin"])
    expect(page.locator("#viewer")).to_have_text("admin")
    job = cluster.submit_job("console-short", SHORT)

    page.goto(f"{console}/jobs")
    expect(page.locator(f"tr.job[data-id='{job}']")).to_be_visible()
    shot(page, "jobs")

    page.goto(f"{console}/jobs/{job}")  # the page reloads itself when the state changes
    expect(page.locator("#state")).to_have_text("RUNNING", timeout=45_000)
    expect(page.locator("#cancel-button")).to_be_visible()
    shot(page, "job-running")

    page.goto(f"{console}/plan")
    expect(page.locator("#plan-grid tbody tr")).to_have_count(4)  # 2 nodes x 2 GPUs
    expect(page.locator("#plan-grid td.cell", has_text=job).first).to_be_visible()
    shot(page, "plan")

    page.goto(f"{console}/")
    expect(page.locator("tr.node")).to_have_count(2)
    shot(page, "cluster")

    page.goto(f"{console}/jobs/{job}")
    expect(page.locator("#state")).to_have_text("SUCCEEDED", timeout=60_000)
    expect(page.locator("#history")).to_contain_text("RUNNING")
    expect(page.locator("#cancel-button")).to_have_count(0)
    shot(page, "job-succeeded")

    for name in ("tenants", "health"):
        page.goto(f"{console}/{name}")
        expect(page.locator("h1")).to_have_text(name.capitalize())
        shot(page, name)

    page.goto(f"{console}/jobs?state=NOPE")  # a bad filter: 400 naming the field, no traceback
    expect(page.locator("#message")).to_contain_text("state: one of PENDING")


def test_a_tenant_sees_only_its_own_jobs_and_the_owner_cancels(
    cluster: RunningCluster, console: str, tokens: dict[str, str], browser: Any
) -> None:
    other = logged_in(browser, console, tokens["other"])
    expect(other.locator("#viewer")).to_contain_text("other")
    other.goto(f"{console}/plan")
    expect(other.locator("#plan-grid td.cell", has_text="*")).to_have_count(0)  # nothing runs yet

    job = cluster.submit_job("console-long", LONG)
    cluster.wait_job(job, ("RUNNING",), timeout_s=60)
    # No reload: the page's script redraws the grid from /plan.json; the job is a `*` here.
    expect(other.locator("#plan-grid td.cell", has_text="*").first).to_be_visible(timeout=30_000)
    assert job not in other.content()
    shot(other, "tenant-plan")

    other.goto(f"{console}/jobs")
    expect(other.locator("#jobs")).to_be_visible()
    expect(other.locator(f"tr.job[data-id='{job}']")).to_have_count(0)
    assert job not in other.content()
    shot(other, "tenant-jobs")

    other.goto(f"{console}/")
    expect(other.locator(".gpu", has_text="*").first).to_be_visible()
    assert job not in other.content()

    answer = other.goto(f"{console}/jobs/{job}")
    assert answer is not None and answer.status == 404
    expect(other.locator("#message")).to_contain_text("not found")
    # The POST actions on the owner's job with the other tenant's token, from its own
    # session's form (cookie and form token) or as a script (bearer): the api's NOT_FOUND.
    session = {"Cookie": f"rota_token={tokens['other']}", "Content-Type": "application/x-www-form-urlencoded"}
    for action in ("cancel", "pause", "resume"):
        as_form = post(console, f"/jobs/{job}/{action}", f"csrf={form_token(tokens['other'])}".encode(), session)
        as_script = post(console, f"/jobs/{job}/{action}", b"", {"Authorization": f"Bearer {tokens['other']}"})
        assert (as_form, as_script) == (404, 404), action
    assert cluster.wait_job(job, ("RUNNING",), timeout_s=5).state == "RUNNING"

    owner = logged_in(browser, console, tokens["demo"])
    expect(owner.locator(f"tr.job[data-id='{job}']")).to_be_visible()
    owner.goto(f"{console}/jobs/{job}")
    expect(owner.locator("#state")).to_have_text("RUNNING")
    owner.click("#cancel-button")
    expect(owner.locator("#said")).to_contain_text("CANCELLED")
    expect(owner.locator("#state")).to_have_text("CANCELLED", timeout=20_000)
    shot(owner, "job-cancelled")
    assert cluster.wait_job(job, ("CANCELLED",), timeout_s=20).state == "CANCELLED"


def test_an_array_has_a_page_with_its_tasks_by_state_and_why_they_wait(
    cluster: RunningCluster, console: str, tokens: dict[str, str], browser: Any
) -> None:
    from rota.client import job_spec_from_mapping

    spec = job_spec_from_mapping({"name": "console-array", "tenant": "demo", "kind": "training", "gpus": 1,
                                  "command": LONG, "duration": "120s"}, base_dir=REPO)
    with cluster.client() as client:
        array = client.submit_array(spec=spec, indices="0-2%1")
    cluster.wait_job(array.job_ids[1], ("PENDING",), timeout_s=60, reason="at most 1 at once")
    owner = logged_in(browser, console, tokens["demo"])
    answer = owner.goto(f"{console}/jobs/{array.id}")
    assert answer is not None and answer.status == 200
    expect(owner.locator("h1")).to_contain_text(array.id)
    expect(owner.locator("#explanation")).to_contain_text("wait for the array's %1 cap")
    expect(owner.locator("tr.task")).to_have_count(3)
    expect(owner.locator("table.tasks[data-state='PENDING'] tr.task")).to_have_count(2)
    shot(owner, "array")
    owner.click(f"a[href='/jobs/{array.job_ids[2]}']")  # each task links to its own page
    expect(owner.locator("h1")).to_contain_text(array.job_ids[2])

    other = logged_in(browser, console, tokens["other"])
    refused = other.goto(f"{console}/jobs/{array.id}")
    assert refused is not None and refused.status == 404
    assert post(console, f"/jobs/{array.id}/cancel", b"", {"Authorization": f"Bearer {tokens['other']}"}) == 404

    owner.goto(f"{console}/jobs/{array.id}")
    owner.click("#cancel-button")
    expect(owner.locator("#said")).to_contain_text("CANCELLED")
    for task in array.job_ids:
        assert cluster.wait_job(task, ("CANCELLED",), timeout_s=20).state == "CANCELLED"


def post(console: str, path: str, body: bytes, headers: dict[str, str]) -> int:
    """The status of a POST to the console, redirects not followed."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())
    try:
        with opener.open(urllib.request.Request(console + path, data=body, headers=headers, method="POST"),
                         timeout=20) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
