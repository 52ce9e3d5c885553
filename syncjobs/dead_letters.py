"""Dead-letter callbacks: run in the job's context, never allowed to break a worker."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable

from .envelope import DeadLetter
from .hooks import already_given

logger = logging.getLogger("syncjobs")

DeadLetterCallback = Callable[[DeadLetter], object]


class DeadLetterHandlers:
    def __init__(self) -> None:
        self._callbacks: list[DeadLetterCallback] = []
        self._lock = threading.Lock()

    def add(self, callback: DeadLetterCallback) -> None:
        if not callable(callback):
            raise TypeError(f"on_dead_letter() takes a callable, got {callback!r}")
        with self._lock:
            if not already_given(self._callbacks, callback):
                self._callbacks.append(callback)

    def emit(self, dead: DeadLetter, context: contextvars.Context, exc: BaseException | None = None) -> None:
        """Hand ``dead`` to every callback, each inside a copy of the dispatcher's context.

        Without a callback the dead letter is logged at ERROR; with one, at
        WARNING, since the app has taken charge of it.
        """
        callbacks = list(self._callbacks)
        extra = {"job_name": dead.name, "job_id": dead.job_id, "attempts": dead.attempts}
        logger.log(
            logging.WARNING if callbacks else logging.ERROR,
            "job %s (%s) is a dead letter %s: %s",
            dead.name,
            dead.job_id,
            f"after {dead.attempts} run(s)" if dead.attempts else "without a run",
            dead.error,
            exc_info=exc,
            extra=extra,
        )
        for callback in callbacks:
            try:
                context.copy().run(callback, dead)
            except BaseException:  # even sys.exit() in a callback must not stop a worker
                logger.exception(
                    "dead-letter callback %r failed for job %s (%s)", callback, dead.name, dead.job_id, extra=extra
                )
