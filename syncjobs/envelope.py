"""The envelope: one job on its way through a store, and the dead letter it may become."""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any

from .job import DEFAULT_PRIORITY


class Envelope:
    """A dispatched job as the stores and the worker loop see it.

    ``payload`` stays encoded until a run decodes it, so every run rebuilds
    the job from what was dispatched, never from what an earlier run changed.

    What every job of a kind shares, its name and the attempts it is allowed,
    are class attributes of a class made once per kind (:func:`envelope_kind`):
    a job pending in memory, where a million may wait, then holds four
    references and no more. Envelopes that carry their own (a claimed database
    row, a job of another priority) are the subclasses below, with slots for them.
    """

    __slots__ = ("attempt", "context", "id", "payload")

    id: str
    name: str
    #: JSON text. A memory store keeps ASCII text as bytes: 16 bytes less a
    #: job than a str on Python 3.10 and 3.11 (8 on later ones).
    payload: str | bytes
    max_attempts: int
    #: Runs already spent (the next run's 0-based number).
    attempt: int
    #: The caller's context at dispatch; each run enters a fresh copy of it.
    context: contextvars.Context
    #: Of the jobs due, higher runs first. A class attribute here: only a
    #: :class:`PrioritizedEnvelope` stores one (most jobs keep the default).
    priority: int = DEFAULT_PRIORITY

    def __init__(
        self, id: str, payload: str | bytes, attempt: int = 0, context: contextvars.Context | None = None
    ) -> None:
        self.id = id
        self.payload = payload
        self.attempt = attempt
        self.context = contextvars.Context() if context is None else context

    def __repr__(self) -> str:
        # Never the payload: envelopes reach logs and tracebacks, payloads must not.
        return f"<{type(self).__name__} {self.id} {self.name!r} attempt {self.attempt} of {self.max_attempts}>"


_kinds: dict[tuple[str, int], type[Envelope]] = {}


def envelope_kind(name: str, max_attempts: int) -> type[Envelope]:
    """The envelope class of the jobs named ``name`` allowed ``max_attempts`` runs (made once)."""
    try:
        return _kinds[name, max_attempts]
    except KeyError:
        # Two threads may both make one: either class serves, and one of them stays.
        kind = type("Envelope", (Envelope,), {"__slots__": (), "name": name, "max_attempts": max_attempts})
        return _kinds.setdefault((name, max_attempts), kind)


def make_envelope(
    id: str,
    name: str,
    payload: str | bytes,
    max_attempts: int,
    *,
    attempt: int = 0,
    context: contextvars.Context | None = None,
    priority: int = DEFAULT_PRIORITY,
) -> Envelope:
    """An envelope of the class its name, attempts and priority call for."""
    if priority == DEFAULT_PRIORITY:
        return envelope_kind(name, max_attempts)(id, payload, attempt, context)
    return PrioritizedEnvelope(id, name, payload, max_attempts, attempt=attempt, context=context, priority=priority)


class PrioritizedEnvelope(Envelope):
    """An envelope whose priority is not the default: its own slots shadow the class attributes."""

    __slots__ = ("max_attempts", "name", "priority")

    def __init__(
        self,
        id: str,
        name: str,
        payload: str | bytes,
        max_attempts: int,
        *,
        attempt: int = 0,
        context: contextvars.Context | None = None,
        priority: int = DEFAULT_PRIORITY,
    ) -> None:
        Envelope.__init__(self, id, payload, attempt, context)
        self.name = name
        self.max_attempts = max_attempts
        self.priority = priority


class ClaimedEnvelope(Envelope):
    """A database row claimed under a lease: the fields only a database store needs.

    Apart, so that an in-memory job (which may wait by the million) does not
    carry them.
    """

    __slots__ = ("keep", "lease", "limit", "max_attempts", "name", "priority", "progress", "result")

    #: A row's payload, as the driver read it.
    payload: str
    #: The lease token of a database claim; every change to the row is fenced on it.
    lease: str | None
    #: The finished run's return value as JSON (None: nothing to keep), and for how many seconds to keep it.
    result: str | None
    keep: float
    #: What the run last reported (JSON), for the record.
    progress: str | None
    #: The limit key whose permit the claim took for it (see ``database/permits.py``), if any.
    limit: str | None

    def __init__(
        self,
        id: str,
        name: str,
        payload: str,
        max_attempts: int,
        *,
        attempt: int = 0,
        context: contextvars.Context | None = None,
        lease: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        limit: str | None = None,
    ) -> None:
        Envelope.__init__(self, id, payload, attempt, context)
        self.name = name
        self.max_attempts = max_attempts
        self.lease = lease
        #: The row's priority, as claimed.
        self.priority = priority
        self.limit = limit
        self.result = None
        self.keep = 0.0
        self.progress = None


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A job that exhausted its attempts, raised ``Fatal``, or cannot be run."""

    job_id: str
    name: str
    payload: dict[str, Any]
    #: Runs spent.
    attempts: int
    error: str
