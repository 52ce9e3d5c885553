"""Stopping workers when the interpreter exits.

Worker threads are not daemons (a job must not be killed mid-write), so the
interpreter's exit waits for them. threading's own exit hook (what
concurrent.futures uses since bpo-39812) runs *before* non-daemon threads are
joined: stopping the workers there is what lets the interpreter exit at all.
A plain ``atexit`` handler would run only after that join, which never ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


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
