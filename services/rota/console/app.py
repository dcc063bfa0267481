"""The console's routes: HTTP requests in, pages and JSON out, every call through the gateway.

`ConsoleApp.handle` is plain (method, path, headers, body) -> Response, so the routing,
authentication and error mapping are testable without a socket; `Handler` adapts it to
`http.server`.

Authentication: the caller's own Rota token, either `Authorization: Bearer TOKEN` (scripts,
the JSON endpoints) or the HttpOnly, SameSite=Strict cookie the login form sets. Every POST
made with the cookie must carry the form token of that session (rota.console.params.form_token)
and, when the browser sends one, an Origin of this console: a page of another site can
neither read the cookie nor forge the form token.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from rota.client import RotaError, UnauthenticatedError
from rota.console.gateway import ACTIONS, ArrayPage, Gateway, Viewer
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

log = logging.getLogger("rota.console")

COOKIE = "rota_token"
MAX_BODY = 64 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
JOB_PATH = re.compile(r"^/jobs/([^/]+?)(\.json|/cancel|/pause|/resume)?$")


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    form: dict[str, list[str]]

    @property
    def wants_json(self) -> bool:
        return self.path.endswith(".json")

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), "")

    def bearer(self) -> str:
        value = self.header("authorization")
        return value[7:].strip() if value.lower().startswith("bearer ") else ""

    def cookie(self) -> str:
        for part in self.header("cookie").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return ""


def redirect(location: str, **headers: str) -> Response:
    return Response(303, headers={"Location": location, **headers})


def local_path(raw: str) -> str:
    """Where a login may send the browser back to: a path of this console, else /."""
    return raw if raw.startswith("/") and not raw.startswith("//") and "\\" not in raw else "/"


class ConsoleApp:
    def __init__(self, gateway: Gateway, views: Views, *, secure_cookie: bool = False) -> None:
        self.gateway = gateway
        self.views = views
        self.secure_cookie = secure_cookie

    # Entry point.
    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes = b"") -> Response:
        url = urlsplit(target)
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True) if method == "POST" else {}
        request = Request(method, url.path or "/", parse_qs(url.query, keep_blank_values=True), headers, form)
        try:
            return self.route(request)
        except BadParameter as exc:
            return self.error(request, 400, f"INVALID_ARGUMENT: {exc.field}: {exc.message}", field=exc.field)
        except UnauthenticatedError as exc:
            if request.wants_json or request.bearer():
                return self.error(request, 401, error_text(exc.code, exc.message))
            return self.login_page(request, 401, f"token refused: {exc.message}", clear=True)
        except RotaError as exc:
            return self.error(request, http_status(exc.code), error_text(exc.code, exc.message, exc.field), field=exc.field)
        except Exception:  # noqa: BLE001 - logged here, never shown: the page says what failed
            log.exception("console: %s %s failed", method, url.path)
            return self.error(request, 500, "INTERNAL: the console failed on this request (see its log)")

    def route(self, r: Request) -> Response:
        path = r.path
        public = self._public_route(r)
        if public is not None:
            return public
        token = r.bearer() or r.cookie()
        if not token:
            if r.wants_json:
                return self.error(r, 401, "UNAUTHENTICATED: give a token (Authorization: Bearer TOKEN)")
            return redirect(f"/login?next={quote(path)}")
        viewer = self.gateway.viewer(token)
        pages: dict[str, Callable[[Request, str, Viewer], Response]] = {
            "/": self.cluster_page, "/jobs": self.jobs_page, "/plan": self.plan_page, "/plan.json": self.plan_json,
            "/tenants": self.tenants_page, "/tenants.json": self.tenants_json, "/health": self.health_page,
        }
        if path in pages:
            if r.method != "GET":
                return self.error(r, 405, f"METHOD_NOT_ALLOWED: {r.method} {path}")
            return pages[path](r, token, viewer)
        match = JOB_PATH.match(path)
        if match:
            return self._job_route(r, token, viewer, job_id(match.group(1)), match.group(2) or "")
        return self.error(r, 404, f"NOT_FOUND: no page {path}")

    def _public_route(self, r: Request) -> Response | None:
        """The pages that need no token (health, static files, login, logout); None for the rest."""
        path = r.path
        if path == "/healthz":
            return Response(200, b"ok\n", "text/plain; charset=utf-8")
        if path.startswith("/static/"):
            found = static_file(path.removeprefix("/static/"))
            if found is None:
                return self.error(r, 404, f"NOT_FOUND: {path}")
            return Response(200, found[0], found[1], {"Cache-Control": "max-age=300"})
        if path == "/login":
            return self.login(r) if r.method == "POST" else self.login_page(r, 200, "")
        if path == "/logout" and r.method == "POST":
            return redirect("/login", **{"Set-Cookie": self.cookie_header("", clear=True)})
        return None

    def _job_route(self, r: Request, token: str, viewer: Viewer, jid: str, suffix: str) -> Response:
        """/jobs/ID (a page), /jobs/ID.json, and /jobs/ID/ACTION (a POST)."""
        if suffix.startswith("/"):
            if r.method != "POST":
                return self.error(r, 405, f"METHOD_NOT_ALLOWED: {suffix[1:]} is a POST")
            return self.act(r, token, jid, suffix[1:])
        if r.method != "GET":
            return self.error(r, 405, f"METHOD_NOT_ALLOWED: {r.method} {r.path}")
        if suffix == ".json":
            return self.json(self.gateway.job_state(token, jid))
        return self.job_page(r, token, viewer, jid)

    # Login.
    def cookie_header(self, token: str, *, clear: bool = False) -> str:
        attributes = "; HttpOnly; SameSite=Strict; Path=/" + ("; Secure" if self.secure_cookie else "")
        return f"{COOKIE}=; Max-Age=0{attributes}" if clear else f"{COOKIE}={token}{attributes}"

    def login_page(self, r: Request, status: int, message: str, *, clear: bool = False) -> Response:
        nxt = local_path((r.query.get("next") or r.form.get("next") or ["/"])[0])
        html = self.views.render("login.html", message=message, next=nxt, viewer=None, page="login", csrf="")
        headers = {"Set-Cookie": self.cookie_header("", clear=True)} if clear else {}
        return Response(status, html.encode(), headers=headers)

    def login(self, r: Request) -> Response:
        token = (r.form.get("token") or [""])[0].strip()
        if not token:
            return self.login_page(r, 400, "token: required (the admin token, or a tenant's from `rota tenants add`)")
        if len(token) > 512 or not re.fullmatch(r"[A-Za-z0-9._~+/=-]+", token):
            return self.login_page(r, 400, "token: not a Rota token")
        self.gateway.viewer(token)  # UNAUTHENTICATED: the login page again, with the api's reason
        nxt = local_path((r.form.get("next") or ["/"])[0])
        return redirect(nxt, **{"Set-Cookie": self.cookie_header(token)})

    # Pages.
    def page(self, template: str, token: str, viewer: Viewer, status: int = 200, **context: Any) -> Response:
        html = self.views.render(template, viewer=viewer, csrf=form_token(token), **context)
        return Response(status, html.encode(), headers={"Cache-Control": "no-store"})

    def cluster_page(self, r: Request, token: str, viewer: Viewer) -> Response:
        return self.page("cluster.html", token, viewer, page="cluster", nodes=self.gateway.cluster(token, viewer))

    def jobs_page(self, r: Request, token: str, viewer: Viewer) -> Response:
        filters = job_filters(r.query)
        return self.page("jobs.html", token, viewer, page="jobs", filters=filters,
                         jobs=self.gateway.jobs(token, filters))

    def job_page(self, r: Request, token: str, viewer: Viewer, jid: str) -> Response:
        said = (r.query.get("said") or [""])[0][:300]
        data = self.gateway.job_or_array(token, jid)
        template = "array.html" if isinstance(data, ArrayPage) else "job.html"
        return self.page(template, token, viewer, page="jobs", said=said, data=data)

    def plan_page(self, r: Request, token: str, viewer: Viewer) -> Response:
        return self.page("plan.html", token, viewer, page="plan", plan=self.gateway.plan(token, viewer))

    def plan_json(self, r: Request, token: str, viewer: Viewer) -> Response:
        plan = self.gateway.plan(token, viewer)
        return self.json({"plan": plan.to_dict() if plan else None})

    def tenants_page(self, r: Request, token: str, viewer: Viewer) -> Response:
        return self.page("tenants.html", token, viewer, page="tenants", data=self.gateway.tenants(token, viewer))

    def tenants_json(self, r: Request, token: str, viewer: Viewer) -> Response:
        return self.json(self.gateway.standings(token))

    def health_page(self, r: Request, token: str, viewer: Viewer) -> Response:
        return self.page("health.html", token, viewer, page="health", data=self.gateway.health(token, viewer))

    # Actions.
    def act(self, r: Request, token: str, jid: str, action: str) -> Response:
        if action not in ACTIONS:
            raise BadParameter("action", f"one of {', '.join(ACTIONS)}")
        if not r.bearer():  # the cookie rides along with any request: prove the page is ours
            origin = r.header("origin")
            if origin and urlsplit(origin).netloc != r.header("host"):
                return self.error(r, 403, "PERMISSION_DENIED: a form of another site")
            if not form_token_ok(token, (r.form.get("csrf") or [""])[0]):
                return self.error(r, 403, "PERMISSION_DENIED: csrf: the form is stale or not this console's; reload the page")
        said = self.gateway.act(token, jid, action)  # the api's refusal: its status and message
        if r.bearer():
            return self.json({"id": jid, "action": action, "result": said})
        return redirect(f"/jobs/{jid}?said={quote(said)}")

    # Answers.
    def json(self, value: Any, status: int = 200) -> Response:
        return Response(status, json.dumps(value, default=str).encode(), "application/json",
                        {"Cache-Control": "no-store"})

    def error(self, r: Request, status: int, message: str, *, field: str = "") -> Response:
        if r.wants_json or r.bearer():
            return self.json({"error": message, "field": field or None}, status)
        html = self.views.render("error.html", status=status, message=message, viewer=None, page="", csrf="")
        return Response(status, html.encode())


class Handler(BaseHTTPRequestHandler):
    """http.server's side: one request in, the app's Response out. `app` is set on a subclass."""

    app: ConsoleApp
    server_version = "rota-console"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self.answer("GET", b"")

    def do_HEAD(self) -> None:  # noqa: N802
        self.answer("GET", b"", head=True)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.send(Response(413, b"request body too large\n", "text/plain; charset=utf-8"))
            return
        self.answer("POST", self.rfile.read(length) if length > 0 else b"")

    def answer(self, method: str, body: bytes, *, head: bool = False) -> None:
        self.send(self.app.handle(method, self.path, dict(self.headers.items()), body), head=head)

    def send(self, response: Response, *, head: bool = False) -> None:
        self.send_response(response.status)
        for name, value in {**SECURITY_HEADERS, "Content-Type": response.content_type, **response.headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if not head:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.info("%s %s", self.address_string(), format % args)
