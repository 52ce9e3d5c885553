"""The dashboard as a WSGI application: routes, login, CSRF, and the responses.

Mounted anywhere (``SCRIPT_NAME`` is its root): under ``syncjobs web``'s own
server, a Flask app's dispatcher, or a Django view. Reads are GET; every
action (retry, cancel, purge, log in and out) is a POST from a page of the
dashboard's own, asked for first on a page that says what it will do.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote

from ..database.connections import DatabaseUnavailable
from . import pages
from .access import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    Access,
    Environ,
    cookie_header,
    cookies,
    cross_site,
    csrf_ok,
    new_csrf,
)
from .board import STATES, Board

logger = logging.getLogger("syncjobs.web")

StartResponse = Callable[..., Any]
Headers = list[tuple[str, str]]

#: The files under static/ the pages use: all the JavaScript there is, shipped in the package.
STATIC = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
#: Every page: nothing from elsewhere, no inline script, never in a frame.
SECURITY_HEADERS = [
    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
]
MAX_FORM = 64 * 1024
FORM_TYPE = "application/x-www-form-urlencoded"
#: Jobs a list shows at most.
LIST_LIMIT = 100
#: What a Location keeps as it is (a path and its query, already quoted where need be).
_URL_SAFE = "/?&=%:@!$'()*+,;~-._"
#: A login's ``next``: a path of the dashboard's own; never ``//host`` or ``/\host`` (another site),
#: no control characters.
_NEXT = re.compile(r"^/(?![/\\])[^\x00-\x1f\x7f\\]*$")
_ACTION = re.compile(r"^/jobs/([^/]+)/(retry|cancel)$")
_JOB = re.compile(r"^/jobs/([^/]+)$")


class Response:
    def __init__(self, status: str, body: str | bytes = b"", content_type: str = "text/html; charset=utf-8") -> None:
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.headers: Headers = [("Content-Type", content_type)]

    @classmethod
    def redirect(cls, location: str) -> Response:
        response = cls("303 See Other")
        # Percent-encoded: a header is latin-1 text, and no character of a path may end it (CR, LF).
        response.headers.append(("Location", quote(location, safe=_URL_SAFE)))
        return response


class Request:
    """What a handler needs of the WSGI environ: the path under the root, the query, the form, cookies."""

    def __init__(self, environ: Environ, *, behind_proxy: bool = False) -> None:
        self.environ = environ
        self.method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        self.root = str(environ.get("SCRIPT_NAME", "")).rstrip("/")
        # WSGI hands the path as latin-1 text of its bytes: back to bytes, read as UTF-8.
        raw = str(environ.get("PATH_INFO", "")) or "/"
        self.path = raw.encode("latin-1", "replace").decode("utf-8", "replace")
        self.query = _single(parse_qs(str(environ.get("QUERY_STRING", "")), keep_blank_values=True))
        scheme = str(environ.get("wsgi.url_scheme", "http"))
        self.host = str(environ.get("HTTP_HOST", ""))
        if behind_proxy:
            # The proxy's word for what the browser asked: its first hop's, as it appended them.
            scheme = _first(environ.get("HTTP_X_FORWARDED_PROTO")) or scheme
            self.host = _first(environ.get("HTTP_X_FORWARDED_HOST")) or self.host
        self.secure = scheme == "https"
        self._form: dict[str, str] | None = None
        #: Whether the request may see the dashboard: asked once (``authorize`` may be the app's own check).
        self.allowed = False
        self.cookies = cookies(environ)

    @property
    def form_encoded(self) -> bool:
        """Whether the body is an urlencoded form, or there is none."""
        kind = str(self.environ.get("CONTENT_TYPE", "")).partition(";")[0].strip().lower()
        return kind == FORM_TYPE or (not kind and not str(self.environ.get("CONTENT_LENGTH") or "0").strip("0"))

    @property
    def form(self) -> dict[str, str]:
        if self._form is None:
            try:
                length = int(self.environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            body = self.environ["wsgi.input"].read(min(max(length, 0), MAX_FORM)) if length > 0 else b""
            self._form = _single(parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True))
        return self._form

    def arg(self, name: str) -> str | None:
        value = self.query.get(name, "").strip()
        return value or None


class Dashboard:
    """The dashboard of ``board``'s jobs table, guarded by ``access``; a WSGI callable.

    ``refresh_seconds``: how often the overview's live part is fetched again.
    """

    def __init__(
        self, board: Board, access: Access, *, refresh_seconds: float = 2.0, behind_proxy: bool = False
    ) -> None:
        if not refresh_seconds > 0:
            raise ValueError(f"refresh_seconds must be more than 0, got {refresh_seconds!r}")
        self.board = board
        self.access = access
        self.refresh_seconds = refresh_seconds
        #: Trust ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` (set only behind a proxy that sets them itself).
        self.behind_proxy = behind_proxy

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ, behind_proxy=self.behind_proxy)
        csrf = request.cookies.get(CSRF_COOKIE) or None
        set_csrf = csrf is None
        if csrf is None:
            csrf = new_csrf()
            # A first visit: forms on this page carry the new token, and the cookie arrives with it.
            request.cookies[CSRF_COOKIE] = csrf
        try:
            response = self._route(request, csrf)
        except DatabaseUnavailable as exc:
            logger.warning("the dashboard's database did not answer: %s", exc)
            response = self._page(
                request,
                csrf,
                "503 Service Unavailable",
                "Database unavailable",
                pages.problem("The database did not answer", "Try again in a moment."),
            )
        headers = response.headers + SECURITY_HEADERS + [("Cache-Control", "no-store")]
        if set_csrf:
            headers.append(cookie_header(CSRF_COOKIE, csrf, path=request.root or "/", secure=request.secure))
        headers.append(("Content-Length", str(len(response.body))))
        start_response(response.status, headers)
        return [response.body] if request.method != "HEAD" else []

    # -- routing ------------------------------------------------------------------

    def _route(self, request: Request, csrf: str) -> Response:
        path = request.path
        if path.startswith("/static/"):
            return _static(path.removeprefix("/static/"))
        if path == "/login" and self.access.has_login:
            return self._login(request, csrf)
        request.allowed = self.access.allows(request.environ)
        if not request.allowed:
            if self.access.has_login:
                target = path + (f"?{request.environ['QUERY_STRING']}" if request.environ.get("QUERY_STRING") else "")
                return Response.redirect(f"{request.root}/login?next={quote(target, safe='')}")
            return self._page(
                request, csrf, "403 Forbidden", "Forbidden", pages.problem("Forbidden", "You may not see this.")
            )
        posting = request.method == "POST"
        if posting and not request.form_encoded:
            # Its forms are urlencoded, as browsers send them: any other body is not one of them.
            response = Response("415 Unsupported Media Type", "send the form urlencoded", "text/plain; charset=utf-8")
            response.headers.append(("Accept-Post", FORM_TYPE))
            return response
        if posting and (
            cross_site(request.environ, request.host)
            or (not self.access.bearer(request.environ) and not csrf_ok(request.environ, request.form))
        ):
            return self._page(
                request,
                csrf,
                "403 Forbidden",
                "Forbidden",
                pages.problem("Forbidden", "The form was not the dashboard's own (CSRF check): go back and try again."),
            )
        if posting:
            return self._post(request)
        if request.method not in ("GET", "HEAD"):
            return _not_allowed("GET, HEAD, POST")
        return self._get(request, csrf)

    def _get(self, request: Request, csrf: str) -> Response:
        path = request.path
        if path == "/":
            if request.arg("part") == "live":
                return Response("200 OK", pages.live(request.root, self.board.overview()))
            live = pages.live(request.root, self.board.overview())
            body = pages.overview(request.root, live, round(self.refresh_seconds * 1000))
            return self._page(request, csrf, "200 OK", "Overview", body, nav="overview")
        if path == "/jobs":
            return self._jobs(request, csrf)
        if path == "/schedules":
            return self._page(
                request, csrf, "200 OK", "Schedules", pages.schedules(self.board.schedules()), nav="schedules"
            )
        if path == "/limits":
            return self._page(request, csrf, "200 OK", "Limits", pages.limits(self.board.limits()), nav="limits")
        if match := _JOB.match(path):
            job = self.board.job(match[1])
            if job is None:
                return self._missing(request, csrf, match[1])
            return self._page(request, csrf, "200 OK", f"Job {job.name}", pages.job_page(request.root, job), nav="jobs")
        if match := _ACTION.match(path):
            return self._confirm_job(request, csrf, match[1], match[2])
        if path == "/purge":
            queue = request.arg("queue")
            if queue is None:
                return self._page(
                    request, csrf, "404 Not Found", "Not found", pages.problem("Not found", "Purge which queue?")
                )
            count = self.board.count_dead(queue)
            body = pages.confirm(
                request.root,
                question=f"Purge the dead letters of queue {queue}?",
                detail=f"This deletes {count} dead letter(s) of queue <code>{pages.esc(queue)}</code> for good.",
                action=f"/purge?queue={quote(queue, safe='')}",
                button=f"Purge {count} dead letter(s)",
                danger=True,
                back="/",
                csrf=csrf,
            )
            return self._page(request, csrf, "200 OK", "Purge dead letters", body)
        if path == "/logout":
            return _not_allowed("POST")
        return self._page(request, csrf, "404 Not Found", "Not found", pages.problem("Not found", "No such page."))

    def _jobs(self, request: Request, csrf: str) -> Response:
        job_id = request.arg("id")
        missing = None
        if job_id is not None:
            if self.board.job(job_id) is not None:
                return Response.redirect(request.root + pages.job_path(job_id))
            missing = job_id
        state = request.arg("state")
        if state is not None and state not in STATES:
            state = None
        name, queue = request.arg("name"), request.arg("queue")
        jobs = self.board.jobs(state=state, name=name, queue=queue, limit=LIST_LIMIT)
        queues = self.board.queue_names()
        body = pages.job_list(
            request.root,
            jobs,
            state=state,
            name=name,
            queue=queue,
            queues=queues,
            limit=LIST_LIMIT,
            missing_id=missing,
        )
        status = "404 Not Found" if missing is not None else "200 OK"
        return self._page(request, csrf, status, "Jobs", body, nav="jobs")

    def _confirm_job(self, request: Request, csrf: str, job_id: str, action: str) -> Response:
        job = self.board.job(job_id)
        if job is None:
            return self._missing(request, csrf, job_id)
        what = f"<code>{pages.esc(job.id)}</code> ({pages.esc(job.name)}, {pages.esc(job.state)})"
        if action == "retry":
            question, button = "Retry this dead job?", "Retry"
            detail = f"Job {what} goes back to its queue with fresh attempts."
        else:
            question, button = "Cancel this job?", "Cancel the job"
            detail = f"Job {what} will not run; if a worker runs it now, the worker is asked to stop it."
        body = pages.confirm(
            request.root,
            question=question,
            detail=detail,
            action=pages.job_path(job.id, action),
            button=button,
            back=pages.job_path(job.id),
            csrf=csrf,
            danger=action == "cancel",
        )
        return self._page(request, csrf, "200 OK", question, body, nav="jobs")

    def _post(self, request: Request) -> Response:
        path, root = request.path, request.root
        if path == "/logout":
            response = Response.redirect(f"{root}/login" if self.access.has_login else f"{root}/")
            response.headers.append(
                cookie_header(SESSION_COOKIE, "", path=root or "/", secure=request.secure, max_age=0)
            )
            return response
        if match := _ACTION.match(path):
            job_id, action = match[1], match[2]
            if action == "retry":
                done = "retried" if self.board.retry(job_id) else "not-dead"
            else:
                found = self.board.cancel(job_id)
                done = {"ended": "cancelled", "requested": "cancel-requested"}.get(found or "", "not-cancelled")
            logger.info("dashboard: %s of job %s: %s", action, job_id, done)
            return Response.redirect(f"{root}{pages.job_path(job_id)}?done={done}")
        if path == "/purge" and (queue := request.arg("queue")) is not None:
            purged = self.board.purge(queue)
            logger.info("dashboard: purged %d dead letter(s) of queue %s", purged, queue)
            return Response.redirect(f"{root}/?done=purged&count={purged}")
        return _not_allowed("GET, HEAD")

    def _login(self, request: Request, csrf: str) -> Response:
        next_path = request.form.get("next") if request.method == "POST" else request.arg("next")
        # Only a path of the dashboard's own: never a redirect elsewhere.
        if not next_path or not _NEXT.match(next_path):
            next_path = "/"
        failed = False
        if request.method == "POST":
            if cross_site(request.environ, request.host) or not csrf_ok(request.environ, request.form):
                failed = True
            elif self.access.check_login(request.form):
                response = Response.redirect(request.root + next_path)
                response.headers.append(
                    cookie_header(
                        SESSION_COOKIE, self.access.new_session(), path=request.root or "/", secure=request.secure
                    )
                )
                return response
            else:
                failed = True
                logger.warning("dashboard: a failed login from %s", request.environ.get("REMOTE_ADDR", "?"))
        body = pages.login(
            request.root, token=self.access.token is not None, csrf=csrf, next_path=next_path, failed=failed
        )
        status = "401 Unauthorized" if failed else "200 OK"
        return self._page(request, csrf, status, "Log in", body, logout=False)

    # -- responses ------------------------------------------------------------------------

    def _page(
        self,
        request: Request,
        csrf: str,
        status: str,
        title: str,
        body: str,
        *,
        nav: str = "",
        logout: bool | None = None,
    ) -> Response:
        done = request.arg("done")
        notice = pages.NOTICES.get(done or "")
        if done == "purged":
            count = request.arg("count") or ""
            notice = f"{int(count)} dead letter(s) purged." if count.isdigit() else notice
        allowed = request.allowed and logout is not False
        signed_in = self.access.has_login and allowed
        html = pages.layout(
            request.root,
            title,
            body,
            description=self.board.description,
            csrf=csrf,
            logout=signed_in,
            notice=notice,
            nav=nav,
            signed_in=allowed,
        )
        return Response(status, html)

    def _missing(self, request: Request, csrf: str, job_id: str) -> Response:
        body = pages.problem(
            "No such job", f"No job with id {job_id} (never dispatched, or finished longer than its keep_result ago)."
        )
        return self._page(request, csrf, "404 Not Found", "No such job", body, nav="jobs")


def _static(name: str) -> Response:
    if name not in STATIC:
        return Response("404 Not Found", "no such file", "text/plain; charset=utf-8")
    data = resources.files(__package__).joinpath("static").joinpath(name).read_bytes()
    return Response("200 OK", data, STATIC[name])


def _not_allowed(allowed: str) -> Response:
    response = Response("405 Method Not Allowed", "method not allowed", "text/plain; charset=utf-8")
    response.headers.append(("Allow", allowed))
    return response


def _first(header: object) -> str:
    return str(header or "").split(",")[0].strip()


def _single(values: Mapping[str, list[str]]) -> dict[str, str]:
    return {key: found[0] for key, found in values.items() if found}
