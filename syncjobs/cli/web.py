"""``syncjobs web``: the dashboard, served by a small threaded WSGI server of the standard library's."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..database import DatabaseUnavailable
from ..errors import QueueError
from ..web import Dashboard, board_on
from ..web.access import Access
from .inspect import open_admin, table_target
from .target import CommandError
from .worker import port_or_any

logger = logging.getLogger("syncjobs.web")

TOKEN_VARIABLE = "SYNCJOBS_WEB_TOKEN"  # noqa: S105 - the variable's name, not a secret
PASSWORD_VARIABLE = "SYNCJOBS_WEB_PASSWORD"  # noqa: S105


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=port_or_any, default=8181, help="the port to serve on (default 8181; 0: any free port)"
    )
    parser.add_argument(
        "--token",
        help=f"the token that logs in (default: ${TOKEN_VARIABLE}; the environment keeps it out of `ps`)",
    )
    parser.add_argument("--user", help="log in with this user and a password instead of a token")
    parser.add_argument("--password", help=f"the user's password (default: ${PASSWORD_VARIABLE})")
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="no login at all: only with --host on this machine's loopback (127.0.0.1, ::1, localhost)",
    )
    parser.add_argument(
        "--refresh", type=float, default=2.0, metavar="SECONDS", help="how often the overview updates (default 2)"
    )
    parser.add_argument(
        "--behind-proxy",
        action="store_true",
        help="trust X-Forwarded-Proto and X-Forwarded-Host: only behind a reverse proxy that sets them (HTTPS)",
    )


def access_from(args: argparse.Namespace) -> Access:
    """The dashboard's login, from the options and the environment.

    A CommandError for none, or for an open dashboard not on loopback.
    """
    if args.no_auth:
        # Only what this command line gives conflicts: a token exported for other runs is left unused.
        if args.token or args.user:
            raise CommandError("--no-auth with a token or a user: give one or the other")
        if not _loopback(args.host):
            raise CommandError(
                f"--no-auth serves the dashboard to anyone who reaches {args.host}: it is allowed only on "
                "loopback (--host 127.0.0.1); give --token or --user and --password instead"
            )
        return Access(open=True)
    token = args.token or os.environ.get(TOKEN_VARIABLE) or None
    password = args.password or os.environ.get(PASSWORD_VARIABLE) or None
    if token and args.user:
        raise CommandError("give a token or a user and password, not both")
    if args.user and not password:
        raise CommandError(f"--user needs a password: --password or ${PASSWORD_VARIABLE}")
    if not token and not args.user:
        raise CommandError(
            f"the dashboard is never open by default: give --token (or ${TOKEN_VARIABLE}), or --user and "
            f"--password, or --no-auth on 127.0.0.1"
        )
    try:
        return Access(token=token, user=args.user, password=password if args.user else None)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    access = access_from(args)
    if not args.refresh > 0:
        raise CommandError(f"--refresh must be more than 0 seconds, got {args.refresh:g}")
    admin = open_admin(args)
    target = table_target(args)
    try:
        board = board_on(admin, target.url, target.connect_args, f"{target.created_by} upgrades it")
    except DatabaseUnavailable:
        raise  # the command's own report of a database that does not answer
    except QueueError as exc:
        raise CommandError(str(exc)) from None
    app = Dashboard(board, access, refresh_seconds=args.refresh, behind_proxy=args.behind_proxy)
    try:
        server = make_server(args.host, args.port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    except OSError as exc:
        board.close()
        raise CommandError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    out.write(f"syncjobs web: serving the dashboard of {board.description} at http://{shown}:{port}/\n")
    out.flush()
    stop = _stop_on_signals(server)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop()
        server.server_close()
        board.close()
    return 0


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: Any, bind_and_activate: bool = True) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler, bind_and_activate)


class _QuietHandler(WSGIRequestHandler):
    """Requests logged at DEBUG through logging, not printed to stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


def _stop_on_signals(server: WSGIServer) -> Callable[[], None]:
    """SIGTERM stops serving as Ctrl-C does; returns what puts the old handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever(), which runs in this thread: from another one.
        threading.Thread(target=server.shutdown, name="syncjobs-web-stop", daemon=True).start()

    previous = signal.signal(signal.SIGTERM, stop)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
