"""A fault-injecting TCP proxy between syncjobs and a real database server.

The tests never stop, restart or pause the machine's own servers: they put
this proxy in the path and break the path instead.

- ``blackhole()``: bytes stop flowing both ways and nothing is reset, as when
  a network path silently dies; new connections are accepted by the kernel
  and then hear nothing. ``resume()`` lets held bytes flow again: a statement
  sent into the black hole still reaches the server afterwards, even if its
  client gave up on it. The proxy's kernel still acknowledges what it holds
  and answers keepalive probes (as a load balancer or PgBouncer in front of a
  frozen server does), so TCP keepalive and ``tcp_user_timeout`` cannot see
  this fault: only a deadline of the client's own (a read timeout, a
  watchdog) can.
- ``cut()``: every open connection is reset at once (a server restart, a
  failover, a NAT that forgot the flow).
- ``refuse()``: every new connection is reset on arrival (the server is down);
  ``resume()`` ends it. ``refuse_new()`` likewise, but open connections
  keep flowing.
- ``lose_reply(marker)``: the next statement whose bytes contain ``marker``
  reaches the server, which runs (and commits) it, and its reply is lost: the
  connection is reset instead. An ambiguous failure, as a cut at the worst
  moment makes it.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from typing_extensions import Self

_CHUNK = 65536
_TICK = 0.02  # how often an idle pump looks at the proxy's state


def _reset(sock: socket.socket) -> None:
    """Close with an RST, not a FIN: the peer sees a dead connection at once."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and its server connection."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.closed = threading.Event()
        #: Set when a client chunk held the armed marker: the server's next reply is lost.
        self.lose_next_reply = False

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            _reset(self.client)
            _reset(self.server)


class FaultProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False
        self._marker: bytes | None = None
        #: How many replies lose_reply() has swallowed.
        self.replies_lost = 0
        #: Connections accepted in all (a test can count reconnects).
        self.accepted = 0
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept_loop, "faultproxy-accept")

    @classmethod
    def for_url(cls, url: str) -> FaultProxy:
        parts = urlsplit(url)
        default = 5432 if parts.scheme.startswith("postgres") else 3306
        return cls(parts.hostname or "127.0.0.1", parts.port or default)

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    # -- faults -----------------------------------------------------------

    def blackhole(self) -> None:
        self._flowing.clear()

    def refuse(self) -> None:
        self._refusing = True
        self.cut()

    def refuse_new(self) -> None:
        self._refusing = True

    def resume(self) -> None:
        self._refusing = False
        self._flowing.set()

    def cut(self) -> int:
        """Reset every open connection; returns how many."""
        with self._lock:
            links, self._links = list(self._links), set()
        for link in links:
            link.close()
        return len(links)

    def lose_reply(self, marker: bytes) -> None:
        self._marker = marker

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._links)

    def held(self) -> int:
        """How many connections have a client's bytes waiting in the proxy (held by a black hole)."""
        with self._lock:
            clients = [link.client for link in self._links if not link.closed.is_set()]
        try:
            ready, _, _ = select.select(clients, [], [], 0) if clients else ([], [], [])
        except (OSError, ValueError):  # a link closed meanwhile
            return 0
        return len(ready)

    @contextlib.contextmanager
    def blackholed(self) -> Iterator[None]:
        self.blackhole()
        try:
            yield
        finally:
            self.resume()

    # -- plumbing ---------------------------------------------------------------

    def _spawn(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            ready, _, _ = select.select([self._listener], [], [], _TICK)
            if not ready:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self._refusing:
                _reset(client)
                continue
            self._spawn(self._connect, "faultproxy-link", client)

    def _connect(self, client: socket.socket) -> None:
        # A new connection during a black hole hears nothing until resume().
        while not self._flowing.wait(_TICK):
            if self._stopped.is_set() or self._refusing:
                _reset(client)
                return
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _reset(client)
            return
        server.settimeout(None)
        link = _Link(client, server)
        with self._lock:
            if self._stopped.is_set():
                link.close()
                return
            self._links.add(link)
        self._spawn(self._pump, "faultproxy-up", link, client, server, True)
        self._pump(link, server, client, False)

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket, upstream: bool) -> None:
        try:
            while not link.closed.is_set():
                if not self._flowing.is_set():
                    # Held, not dropped: the kernel buffers fill and the peer
                    # waits, as over a path whose packets go nowhere.
                    self._flowing.wait(_TICK)
                    continue
                ready, _, _ = select.select([source], [], [], _TICK)
                if not ready or not self._flowing.is_set():
                    continue
                data = source.recv(_CHUNK)
                if not data:
                    break
                if upstream and self._marker is not None and self._marker in data:
                    self._marker = None
                    link.lose_next_reply = True
                elif not upstream and link.lose_next_reply:
                    self.replies_lost += 1
                    break
                target.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._links.discard(link)
        link.close()

    def close(self) -> None:
        self._stopped.set()
        self.resume()
        self.cut()
        # The accept loop leaves within a tick of the stop; its listener is
        # closed only then, not under a select() it is in.
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Call:
    """``call()`` running in a daemon thread, timed.

    A call that hangs under a fault must fail the test, not hang it: the test
    waits a bounded time and asserts; the thread finishes on its own once the
    path comes back.
    """

    def __init__(self, call: Callable[[], object]) -> None:
        self._call = call
        self.result: object = None
        self.error: BaseException | None = None
        self.began = time.monotonic()
        self.ended: float | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, name="faultproxy-call", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which asserts on it
            self.error = exc
        finally:
            self.ended = time.monotonic()
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def seconds(self) -> float:
        """How long it took, or has been running."""
        return (self.ended if self.ended is not None else time.monotonic()) - self.began

    def __repr__(self) -> str:
        state = f"raised {self.error!r}" if self.error is not None else f"returned {self.result!r}"
        return f"<call {state if self.done else 'still blocked'} after {self.seconds:.2f} s>"


def bounded(call: Callable[[], object], limit: float) -> Call:
    """Start ``call`` and wait for it at most ``limit`` seconds."""
    started = Call(call)
    started.wait(limit)
    return started
