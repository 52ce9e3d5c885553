"""A small client for the dashboard's WSGI app, in the test's own process: a browser's cookies, no network."""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Callable, Iterable, Mapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode, urlsplit
from wsgiref.util import setup_testing_defaults

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclasses.dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    text: str

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def headers_named(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]

    @property
    def location(self) -> str:
        found = self.header("Location")
        assert found is not None, f"no Location in a {self.status} reply"
        return found

    def form_value(self, name: str) -> str:
        """The value of the page's (first) input named ``name``."""
        match = re.search(rf'name="{re.escape(name)}" value="([^"]*)"', self.text)
        assert match is not None, f"no input {name!r} on the page"
        return match[1]


class Client:
    """Requests ``app`` as a browser would: it keeps the cookies the app sets (on any path) and sends them back."""

    def __init__(self, app: WSGIApp, *, script_name: str = "", host: str = "127.0.0.1:8181") -> None:
        self.app = app
        self.script_name = script_name
        self.host = host
        self.cookies: dict[str, str] = {}

    def get(self, path: str, **options: Any) -> Reply:
        return self.request("GET", path, **options)

    def post(self, path: str, form: Mapping[str, str] | None = None, **options: Any) -> Reply:
        return self.request("POST", path, form=form, **options)

    def request(
        self,
        method: str,
        path: str,
        *,
        form: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        cookies: bool = True,
    ) -> Reply:
        """``path`` under the app's root (a full path starting with the script name is taken as is)."""
        if self.script_name and path.startswith(self.script_name + "/"):
            path = path[len(self.script_name) :]
        path, _, query = path.partition("?")
        body = urlencode(form or {}).encode()
        environ: dict[str, Any] = {}
        setup_testing_defaults(environ)
        environ.update(
            REQUEST_METHOD=method,
            SCRIPT_NAME=self.script_name,
            PATH_INFO=path,
            QUERY_STRING=query,
            HTTP_HOST=self.host,
            CONTENT_TYPE="application/x-www-form-urlencoded",
            CONTENT_LENGTH=str(len(body)),
        )
        environ["wsgi.input"] = io.BytesIO(body)
        if cookies and self.cookies:
            environ["HTTP_COOKIE"] = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        for name, value in (headers or {}).items():
            key = name.upper().replace("-", "_")
            environ[key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"] = value
        seen: dict[str, Any] = {}

        def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            seen["status"], seen["headers"] = status, response_headers

        chunks = self.app(environ, start_response)
        try:
            data = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        reply = Reply(int(seen["status"].split()[0]), list(seen["headers"]), data.decode("utf-8"))
        for value in reply.headers_named("Set-Cookie"):
            jar: SimpleCookie = SimpleCookie()
            jar.load(value)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0":
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return reply

    def follow(self, reply: Reply) -> Reply:
        """GET the place a redirect points to."""
        assert reply.status in (301, 302, 303, 307), f"not a redirect: {reply.status}"
        target = urlsplit(reply.location)
        return self.get(target.path + (f"?{target.query}" if target.query else ""))
