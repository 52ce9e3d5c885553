"""The envelope: one job on its way through a store, and the dead letter it may become."""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any, ClassVar

from .job import DEFAULT_PRIORITY


@dataclasses.dataclass(slots=True)
class Envelope:
    """A dispatched job as the stores and the worker loop see it.

    ``payload`` stays JSON text until a run decodes it, so every run rebuilds
    the job from what was dispatched, never from what an earlier run changed.
    """

    id: str
    name: str
    payload: str
    max_attempts: int
    #: Runs already spent (the next run's 0-based number).
    attempt: int = 0
    #: The caller's context at dispatch; each run enters a fresh copy of it.
    context: contextvars.Context = dataclasses.field(default_factory=contextvars.Context)
    #: Of the jobs due, higher runs first. A class attribute here: only a
    #: :class:`PrioritizedEnvelope` stores one (most jobs keep the default).
    priority: ClassVar[int] = DEFAULT_PRIORITY


@dataclasses.dataclass(slots=True)
class PrioritizedEnvelope(Envelope):
    """An envelope whose priority is not the default: its own slot shadows the class attribute."""

    priority: int = DEFAULT_PRIORITY  # type: ignore[misc]


@dataclasses.dataclass(slots=True)
class ClaimedEnvelope(Envelope):
    """A database row claimed under a lease: the fields only a database store needs.

    Apart, so that an in-memory job (which may wait by the million) does not
    carry them.
    """

    #: The lease token of a database claim; every change to the row is fenced on it.
    lease: str | None = None
    #: The finished run's return value as JSON (None: nothing to keep), and for how many seconds to keep it.
    result: str | None = None
    keep: float = 0.0
    #: What the run last reported (JSON), for the record.
    progress: str | None = None
    #: The row's priority, as claimed.
    priority: int = DEFAULT_PRIORITY  # type: ignore[misc]
    #: The limit key whose permit the claim took for it (see ``database/permits.py``), if any.
    limit: str | None = None


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A job that exhausted its attempts, raised ``Fatal``, or cannot be run."""

    job_id: str
    name: str
    payload: dict[str, Any]
    #: Runs spent.
    attempts: int
    error: str
