"""Who may use the dashboard: a token or a user and password, signed session cookies, CSRF.

A session is a cookie that says until when it is good, signed with a key
derived from the credentials (slowly: a stolen cookie is no fast oracle for
guessing them): every process given the same credentials accepts it
(several gunicorn workers, a restart), and changing them ends every
session. State-changing requests carry a CSRF token equal to a random
``SameSite=Strict`` cookie (a double submit), and one that the browser says
came from another site (``Origin``, ``Sec-Fetch-Site``) is refused whatever
it carries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

SESSION_COOKIE = "syncjobs_session"
CSRF_COOKIE = "syncjobs_csrf"
#: How long a login lasts.
SESSION_SECONDS = 12 * 3600

Environ = Mapping[str, Any]


class Access:
    """The dashboard's credentials: a ``token``, or a ``user`` and ``password``; or ``authorize``; or none.

    ``authorize(environ)`` is for a dashboard mounted in an app that has its
    own login (Django's staff, a Flask app's): it says whether the request's
    user may use the dashboard, and the dashboard has no login page of its own.
    ``open=True`` lets anyone in: only for a dashboard bound to localhost.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        authorize: Callable[[Environ], bool] | None = None,
        open: bool = False,
    ) -> None:
        if (user is None) != (password is None):
            raise ValueError("give a user and a password together")
        modes = [token is not None, user is not None, authorize is not None, open]
        if sum(modes) != 1:
            raise ValueError(
                "the dashboard needs exactly one of: token=, user= and password=, authorize=, or open=True"
            )
        for what, value in (("token", token), ("password", password), ("user", user)):
            if value is not None and not value.strip():
                raise ValueError(f"the dashboard's {what} is empty")
        self.token = token
        self.user = user
        self.password = password
        self.authorize = authorize
        self.open = open
        credential = token if token is not None else f"{user}\0{password}" if user is not None else None
        self._key = None if credential is None else _session_key(credential)

    @property
    def has_login(self) -> bool:
        """Whether the dashboard shows its own login page (token or user and password)."""
        return self._key is not None

    def check_login(self, form: Mapping[str, str]) -> bool:
        """Whether a login form's fields are the credentials (compared in constant time)."""
        if self.token is not None:
            return _same(form.get("token", ""), self.token)
        if self.user is not None and self.password is not None:
            # Both compared, always: how long it takes says nothing of which was wrong.
            user_ok = _same(form.get("user", ""), self.user)
            password_ok = _same(form.get("password", ""), self.password)
            return user_ok and password_ok
        return False

    def allows(self, environ: Environ) -> bool:
        """Whether the request may see the dashboard: a session, a credential in its header, or ``authorize``."""
        if self.open:
            return True
        if self.authorize is not None:
            return bool(self.authorize(environ))
        return (
            self.bearer(environ)
            or self._basic(environ)
            or self._session_valid(cookies(environ).get(SESSION_COOKIE, ""))
        )

    def bearer(self, environ: Environ) -> bool:
        """Whether the request carries the token in ``Authorization: Bearer``, as a script does.

        A browser never adds that header by itself (it may add cached Basic
        credentials to another site's form), so such a request needs no CSRF token.
        """
        scheme, value = _authorization(environ)
        return self.token is not None and scheme == "bearer" and _same(value, self.token)

    def _basic(self, environ: Environ) -> bool:
        """Whether the request carries the user and password in ``Authorization: Basic``."""
        scheme, value = _authorization(environ)
        if self.user is None or scheme != "basic":
            return False
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return self.check_login({"user": user, "password": password})

    def new_session(self, now: float | None = None) -> str:
        """The value of a session cookie good for SESSION_SECONDS."""
        until = str(int((time.time() if now is None else now) + SESSION_SECONDS))
        return f"{until}.{self._sign(until)}"

    def _session_valid(self, value: str) -> bool:
        until, _, mac = value.partition(".")
        if self._key is None or not until.isdigit() or not _same(mac, self._sign(until)):
            return False
        return int(until) > time.time()

    def _sign(self, text: str) -> str:
        return hmac.new(self._key or b"", text.encode(), hashlib.sha256).hexdigest()


def _authorization(environ: Environ) -> tuple[str, str]:
    """The ``Authorization`` header's scheme (lower case) and credential."""
    scheme, _, value = str(environ.get("HTTP_AUTHORIZATION", "")).partition(" ")
    return scheme.lower(), value.strip()


def cross_site(environ: Environ, host: str) -> bool:
    """Whether the browser says the request comes from another site: its ``Origin`` or ``Sec-Fetch-Site``."""
    if str(environ.get("HTTP_SEC_FETCH_SITE", "")).lower() == "cross-site":
        return True
    origin = str(environ.get("HTTP_ORIGIN", ""))
    return bool(origin) and origin != "null" and urlsplit(origin).netloc != host


def csrf_ok(environ: Environ, form: Mapping[str, str]) -> bool:
    """Whether a state-changing request carries the CSRF token its page had (the cookie's value, repeated)."""
    cookie = cookies(environ).get(CSRF_COOKIE, "")
    return bool(cookie) and _same(form.get("csrf", ""), cookie)


def new_csrf() -> str:
    return secrets.token_urlsafe(32)


def cookies(environ: Environ) -> dict[str, str]:
    """The request's cookies, read leniently: another app's malformed cookie on the host spoils none of ours."""
    found: dict[str, str] = {}
    for pair in str(environ.get("HTTP_COOKIE", "")).split(";"):
        name, sep, value = pair.strip().partition("=")
        if sep and name and name not in found:
            found[name] = value.strip().strip('"')
    return found


def cookie_header(name: str, value: str, *, path: str, secure: bool, max_age: int | None = None) -> tuple[str, str]:
    """A ``Set-Cookie`` header: HttpOnly, SameSite=Strict, on the dashboard's path; Secure over HTTPS."""
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return ("Set-Cookie", "; ".join(parts))


def _session_key(credential: str) -> bytes:
    # PBKDF2, once per process: each guess of the credentials from a stolen cookie costs as much.
    return hashlib.pbkdf2_hmac("sha256", credential.encode(), b"syncjobs-web-session", 100_000)


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
