"""The web dashboard (``syncjobs.web``) inside a Django project, behind the staff login.

Mounted with ``path("jobs/", include("syncjobs.contrib.django.urls"))``: an
anonymous visitor is sent to the login page (the admin's, where
``django.contrib.admin`` is installed), a signed-in user who is not staff
gets 403, and an active staff member sees the dashboard of the jobs table the
project's queues use (settings.SYNCJOBS ``"DATABASE"`` or ``"URL"``).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

from django.apps import apps
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import NoReverseMatch, reverse
from django.views.decorators.csrf import csrf_exempt

from ...database import DatabaseJobQueue
from ...queue import StoreQueue
from ...web import Access, Board, Dashboard, queue_board
from ...web.access import Environ
from ...web.mounted import QueueDashboard
from . import get_queue

#: The environ key the view sets once the user passed its staff check; only this module holds the value.
STAFF_CHECKED = "syncjobs.django.staff_checked"
_CHECKED = object()

Headers = list[tuple[str, str]]


def _passed_staff_check(environ: Environ) -> bool:
    # An object no request header can spell: the view's own mark, never the client's.
    return environ.get(STAFF_CHECKED) is _CHECKED


def _board(queue: StoreQueue) -> Board:
    if not isinstance(queue, DatabaseJobQueue):
        raise ImproperlyConfigured(
            "the syncjobs dashboard shows a database's jobs table, and settings.SYNCJOBS uses the memory "
            'backend (its jobs live inside each web process): set "DATABASE" or "URL"'
        )
    return queue_board(queue)


_dashboard = QueueDashboard(get_queue, _board, Access(authorize=_passed_staff_check))


# The dashboard checks CSRF itself, on its own forms: a token in a SameSite=Strict cookie that
# each form repeats, and the Origin. Django's check would refuse those forms (they carry the
# dashboard's token, not Django's), and it would add nothing: csrf_exempt hands the check over.
@csrf_exempt
def dashboard_view(request: HttpRequest, rest: str = "") -> HttpResponseBase:
    """The dashboard at the URL this view is mounted at; ``rest``: the dashboard's path below it."""
    user = getattr(request, "user", None)
    if user is None:
        raise ImproperlyConfigured(
            "the syncjobs dashboard needs django.contrib.auth's AuthenticationMiddleware in MIDDLEWARE"
        )
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path(), _login_url())
    if not (user.is_active and getattr(user, "is_staff", False)):
        raise PermissionDenied("the jobs dashboard is for staff")
    environ = wsgi_environ(request, rest)
    environ[STAFF_CHECKED] = _CHECKED
    return call_wsgi(_dashboard.get(), environ)


def _login_url() -> str | None:
    """The admin's login page where the admin is installed and mounted; else None (settings.LOGIN_URL)."""
    if not apps.is_installed("django.contrib.admin"):
        return None
    try:
        return reverse("admin:login")
    except NoReverseMatch:
        return None


def wsgi_environ(request: HttpRequest, rest: str) -> dict[str, Any]:
    """A WSGI environ for the dashboard mounted where ``request`` came in: its root the path above ``rest``.

    Built from ``request.META`` (the server's environ under WSGI, its
    equivalent under ASGI), with the host and scheme as Django sees them
    (ALLOWED_HOSTS, a trusted proxy's headers) and the body Django read.
    """
    path = "/" + rest
    mount = request.path.removesuffix(rest).rstrip("/")
    body = request.body
    environ: dict[str, Any] = dict(request.META)
    environ.update(
        {
            "REQUEST_METHOD": request.method or "GET",
            # The dashboard writes its root into links and cookie paths as it is: a URL path, quoted.
            "SCRIPT_NAME": quote(mount),
            # WSGI's form of a path: its UTF-8 bytes as latin-1 text.
            "PATH_INFO": path.encode("utf-8").decode("latin-1"),
            "QUERY_STRING": str(request.META.get("QUERY_STRING", "")),
            "HTTP_HOST": request.get_host(),
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": request.META.get("wsgi.errors", sys.stderr),
            "wsgi.url_scheme": request.scheme,
            "wsgi.version": (1, 0),
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
    )
    return environ


def call_wsgi(app: Dashboard, environ: dict[str, Any]) -> HttpResponse:
    """Call the WSGI ``app`` and turn its status, headers and body into a Django response."""
    seen: dict[str, Any] = {}
    written: list[bytes] = []

    def start_response(status: str, headers: Headers, exc_info: Any = None) -> Callable[[bytes], None]:
        seen["status"], seen["headers"] = status, headers
        return written.append

    chunks = app(environ, start_response)
    try:
        body = b"".join([*written, *chunks])
    finally:
        _close(chunks)
    return django_response(seen["status"], seen["headers"], body)


def django_response(status: str, headers: Headers, body: bytes) -> HttpResponse:
    """An HttpResponse with the WSGI ``status``, ``headers`` (each ``Set-Cookie`` a cookie of it) and ``body``."""
    code, _, reason = status.partition(" ")
    response = HttpResponse(body, status=int(code), reason=reason or None)
    for name, value in headers:
        if name.lower() == "set-cookie":
            # As a plain header, a second Set-Cookie would replace the first (response[name]
            # holds one value): each becomes a cookie of the response, its attributes kept.
            response.cookies.load(value)
        else:
            response[name] = value
    return response


def _close(chunks: Iterable[bytes]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()
