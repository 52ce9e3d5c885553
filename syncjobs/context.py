"""What a running job can ask about itself: ``current_job()`` and its cancel token."""

from __future__ import annotations

import contextvars
import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """The run in progress, as ``current_job()`` returns it."""

    id: str
    name: str
    #: 0-based number of this run.
    attempt: int
    max_attempts: int
    #: Set when shutdown's grace has run out: stop between steps, or raise ``Cancelled``.
    cancelled: threading.Event


_current: contextvars.ContextVar[RunInfo | None] = contextvars.ContextVar("syncjobs_current_job", default=None)


def current_job() -> RunInfo | None:
    """The run this thread is executing, or ``None`` outside a run."""
    return _current.get()


def set_current(info: RunInfo | None) -> contextvars.Token[RunInfo | None]:
    return _current.set(info)


def reset_current(token: contextvars.Token[RunInfo | None]) -> None:
    _current.reset(token)
