"""A listening socket of any family (a Unix socket, ``::1``) piped to a TCP server: what the machine's
PostgreSQL does not offer itself, for the tests of how syncjobs reaches Django's databases."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

from typing_extensions import Self


class Forwarder:
    """Accepts on ``listener`` and pipes each connection to ``upstream`` until closed."""

    def __init__(self, listener: socket.socket, upstream: tuple[str, int]) -> None:
        self.listener = listener
        self.upstream = upstream
        #: Connections accepted: proof that a client came this way.
        self.accepted = 0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, name="forwarder-accept", daemon=True)]
        self._threads[0].start()

    @classmethod
    def unix(cls, path: str, upstream: tuple[str, int]) -> Forwarder:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen()
        return cls(listener, upstream)

    @classmethod
    def tcp(cls, host: str, upstream: tuple[str, int]) -> Forwarder:
        return cls(socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET), upstream)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return  # closed
            with self._lock:
                self.accepted += 1
                self._sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                thread = threading.Thread(target=_pump, args=(source, target), name="forwarder-pump", daemon=True)
                self._threads.append(thread)
                thread.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(timeout=10)
        for sock in sockets:
            sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass  # the other side went away, or close() shut it
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
