"""Stopping workers when the interpreter exits.

Worker threads are not daemons (a job must not be killed mid-write), so the
interpreter's exit waits for them. threading's own exit hook (what
concurrent.futures uses since bpo-39812) runs *before* non-daemon threads are
joined: stopping the workers there is what lets the interpreter exit at all.
A plain ``atexit`` handler would run only after that join, which never ends.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger("syncjobs")


def before_threads_join(callback: Callable[[], None]) -> bool:
    """Call ``callback`` at interpreter exit, before non-daemon threads are joined.

    Hooks run last-registered first, and worker.py imports
    concurrent.futures.thread (which registers its joining hook) before any
    queue exists, so this one always runs before that join. False when the
    interpreter is already exiting, or the hook is unavailable.
    """
    register: Any = getattr(threading, "_register_atexit", None)
    if register is None:
        return False
    try:
        register(callback)
    except RuntimeError:  # the interpreter is already shutting down
        return False
    return True


class StoppedAtExit(Protocol):
    def stop_at_exit(self) -> None:
        """Stop what still runs, with no grace, and warn of what the exit costs."""


class ExitWatch:
    """The queues alive in this process; each is stopped when the interpreter exits.

    A queue joins when built, so this hook is registered before any a
    framework integration registers later (hooks run last-registered first):
    an integration's own hook, with the grace, runs before this one.
    """

    def __init__(self) -> None:
        self._live: weakref.WeakSet[StoppedAtExit] = weakref.WeakSet()
        # Held strongly while running: a started queue its owner dropped
        # still has workers, and must still be stopped at exit. By pid: a
        # forked child inherits the set (and this hook), not the workers.
        self._started: dict[StoppedAtExit, int] = {}
        self._lock = threading.Lock()
        self._registered = False

    def watch(self, queue: StoppedAtExit) -> None:
        self._live.add(queue)
        with self._lock:
            if not self._registered:
                # Stopped before the interpreter joins their (non-daemon) threads.
                self._registered = before_threads_join(self._stop_all)

    def started(self, queue: StoppedAtExit) -> None:
        with self._lock:
            self._started[queue] = os.getpid()

    def stopped(self, queue: StoppedAtExit) -> None:
        with self._lock:
            self._started.pop(queue, None)

    def running_here(self, queue: StoppedAtExit) -> bool:
        """Started in this process and not shut down since."""
        with self._lock:
            return self._started.get(queue) == os.getpid()

    def _stop_all(self) -> None:
        for queue in list(self._live):
            try:
                queue.stop_at_exit()
            except Exception:
                logger.exception("syncjobs could not stop a queue at exit")


#: The one watch of this process.
exit_watch = ExitWatch()
