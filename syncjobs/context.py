"""What a running job can ask about itself: ``current_job()`` and its cancel token."""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Callable
from typing import Any, Final

from .errors import Cancelled
from .status import MAX_NOTE, Progress

# Guards the lazy creation of cancel events; taken only when a job first looks
# at its token or shutdown cancels a run, never on the hot path.
_cancel_lock = threading.Lock()

#: A RunInfo's ``subject`` when none is given: its reports go to ``report(progress)``.
_NO_SUBJECT: Final = object()


class RunInfo:
    """The run in progress, as ``current_job()`` returns it."""

    __slots__ = (
        "_cancel_requested",
        "_event",
        "_report",
        "_subject",
        "attempt",
        "id",
        "latest_progress",
        "max_attempts",
        "name",
    )

    def __init__(  # noqa: PLR0917 - by position: see below
        self,
        id: str,
        name: str,
        attempt: int,
        max_attempts: int,
        report: Callable[[Progress], object] | Callable[[Any, Progress], object] | None = None,
        subject: object = _NO_SUBJECT,
    ) -> None:
        """Each :meth:`progress` report goes to ``report(progress)``, or ``report(subject, progress)`` given a subject.

        The worker passes its store's method and the job's envelope: no
        object made per run to bind them (a ``partial`` cost a twentieth of
        a no-op run). Both may come by position: a class called with a
        keyword argument costs a dict per call.
        """
        self.id = id
        self.name = name
        #: 0-based number of this run.
        self.attempt = attempt
        self.max_attempts = max_attempts
        self._event: threading.Event | None = None
        self._cancel_requested = False
        #: What the run last reported with :meth:`progress` (None before it does).
        self.latest_progress: Progress | None = None
        self._report: Callable[..., object] | None = report
        self._subject = subject

    @property
    def cancelled(self) -> threading.Event:
        """Set when the run should stop: shutdown's grace ran out, or the job's timeout.

        Stop between steps, or raise ``Cancelled`` (what :meth:`check` does).
        """
        # Made on first use: most jobs never look, and an Event costs more
        # than the rest of a no-op run.
        event = self._event
        if event is None:
            with _cancel_lock:
                if self._event is None:
                    self._event = threading.Event()
                    if self._cancel_requested:
                        self._event.set()
                event = self._event
        return event

    def check(self) -> None:
        """Raise ``Cancelled`` if the run was asked to stop; a long job calls it between steps."""
        if self._cancel_requested:
            raise Cancelled()

    def cancel(self) -> None:
        """Ask the run to stop (shutdown does this once the grace has run out)."""
        with _cancel_lock:
            self._cancel_requested = True
            event = self._event
        if event is not None:
            event.set()

    def progress(self, done: float, total: float | None = None, note: str = "") -> None:
        """Report how far the run has come: ``done`` of ``total`` (if known), with a short ``note``.

        Shown by ``status()`` and ``syncjobs show``. Cheap in a tight loop:
        the report is kept as it is (a database writes each job's latest at
        most once a second, off this thread), and the last one goes with the
        job's record when the run ends.
        """
        self.latest_progress = progress = self._checked_progress(done, total, note)
        report = self._report  # read once: an abandoning thread may clear it meanwhile
        if report is None:
            return
        if self._subject is _NO_SUBJECT:
            report(progress)
        else:
            report(self._subject, progress)

    def stop_reports(self) -> None:
        """Pass no more reports on (the run was abandoned); :attr:`latest_progress` still follows them."""
        self._report = None

    def _checked_progress(self, done: object, total: object, note: object) -> Progress:
        if isinstance(done, bool) or not isinstance(done, (int, float)):
            raise TypeError(f"{self._where()}: done must be a number >= 0, got {done!r}")
        if not 0 <= done < math.inf:
            raise ValueError(f"{self._where()}: done must be a number >= 0, got {done!r}")
        if total is not None:
            if isinstance(total, bool) or not isinstance(total, (int, float)):
                raise TypeError(f"{self._where()}: total must be a number > 0 (or None), got {total!r}")
            if not 0 < total < math.inf:
                raise ValueError(f"{self._where()}: total must be a number > 0 (or None), got {total!r}")
        if not isinstance(note, str):
            raise TypeError(f"{self._where()}: note must be a string, got {type(note).__name__}")
        return Progress(done, total, note[:MAX_NOTE])

    def _where(self) -> str:
        return f"job {self.name!r} ({self.id}): progress()"

    def __repr__(self) -> str:
        return f"RunInfo(id={self.id!r}, name={self.name!r}, attempt={self.attempt}, max_attempts={self.max_attempts})"


current_run: contextvars.ContextVar[RunInfo | None] = contextvars.ContextVar("syncjobs_current_job", default=None)
_current = current_run


_MISSING = object()
#: The context the last dispatch carried; the next one reuses it while nothing in it changed.
_last_carried = contextvars.Context()


def carried_context() -> contextvars.Context:
    """The caller's context, as a dispatched job carries it (never the caller's run).

    Dispatches that see the same variables bound to the same objects share one
    Context object: a pending job then costs no Context of its own. Sharing is
    safe because a Context is never entered as it is: each run, and each
    dead-letter callback, enters a copy of it.
    """
    context = contextvars.copy_context()
    if context.get(_current) is not None:
        # Dispatched from inside a run: the child job is not that run.
        context.run(_current.set, None)
    global _last_carried  # noqa: PLW0603 - a cache; a race between threads only loses a share
    last = _last_carried
    # Identity, not ==: equal values may be different objects (and == runs user code).
    size = len(context)
    if len(last) == size and (not size or all(last.get(var, _MISSING) is value for var, value in context.items())):
        return last
    _last_carried = context
    return context


def current_job() -> RunInfo | None:
    """The run this thread is executing, or ``None`` outside a run."""
    return _current.get()
