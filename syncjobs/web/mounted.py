"""The dashboard of the queue a framework integration builds, made at first use and again for another queue."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..queue import StoreQueue
from .access import Access, Environ
from .app import Dashboard, StartResponse
from .board import Board


class QueueDashboard:
    """A WSGI app: the dashboard of ``board(queue())``, built at its first request.

    Built again once ``queue()`` gives another queue: after the app's settings
    changed (the old queue shut down and closed its connections), or in a
    forked process (which builds queues of its own).
    """

    def __init__(
        self,
        queue: Callable[[], StoreQueue],
        board: Callable[[StoreQueue], Board],
        access: Access,
        *,
        refresh_seconds: float = 2.0,
    ) -> None:
        self._queue = queue
        self._board = board
        self._access = access
        self._refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._built: tuple[StoreQueue, Dashboard] | None = None

    def get(self) -> Dashboard:
        queue = self._queue()
        with self._lock:
            if self._built is None or self._built[0] is not queue:
                dashboard = Dashboard(self._board(queue), self._access, refresh_seconds=self._refresh_seconds)
                self._built = (queue, dashboard)
            return self._built[1]

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        app: Any = self.get()
        result: Iterable[bytes] = app(environ, start_response)
        return result
