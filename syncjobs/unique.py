"""Unique jobs: a job that declares a key is dispatched only while no other job holds that key.

A duplicate dispatch enqueues nothing and returns the handle of the job that
holds the key (``handle.duplicate`` is True). Each store enforces it where
every dispatcher meets: a dict under a lock in memory, a table keyed by the
key's hash in a database (see ``database/unique_keys.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NamedTuple

from .job_keys import KeyFunction, check_key_spec, check_known_fields, key_digest

#: How long a key holds: while the job waits to run (queued, scheduled, or
#: waiting for a retry), or until it has finished (done, dead or cancelled);
#: ``seconds=`` holds it for that long after dispatch, whatever happens to the job.
Holds = Literal["queued", "unfinished"]
_HOLDS: tuple[str, ...] = ("queued", "unfinished")


class Unique:
    """A job's uniqueness: ``UNIQUE = Unique("user_id")`` on a job class, ``unique=`` on a task.

    The key is made of the named payload fields (a task's parameters), or of
    what ``key(payload)`` returns (JSON), or of the whole payload when neither
    is given; with the job's NAME, so that two kinds of job never share one,
    and (in a database) the queue's name: each queue has its own keys.

    ``holds="queued"`` (the default): while a job with the key waits to run,
    a dispatch of another is a duplicate; once it has begun, a new one is
    enqueued. ``holds="unfinished"``: until it is done, dead or cancelled.
    ``seconds=N``: for N seconds after its dispatch, even once it has finished.
    """

    __slots__ = ("fields", "holds", "key", "seconds")

    def __init__(
        self,
        *fields: str,
        key: KeyFunction | None = None,
        holds: Holds | None = None,
        seconds: float | None = None,
    ) -> None:
        check_key_spec("Unique()", fields, key)
        if seconds is not None:
            if holds is not None:
                raise TypeError("Unique(): give holds= or seconds=, not both")
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
                raise TypeError(f"Unique(): seconds must be a number > 0, got {seconds!r}")
        elif holds is None:
            holds = "queued"
        elif holds not in _HOLDS:
            raise TypeError(f"Unique(): holds must be 'queued' or 'unfinished', got {holds!r}")
        self.fields: tuple[str, ...] = fields
        self.key = key
        self.holds: Holds | None = holds
        self.seconds: float | None = None if seconds is None else float(seconds)

    def __repr__(self) -> str:
        shown = [repr(field) for field in self.fields]
        if self.key is not None:
            shown.append(f"key={self.key!r}")
        shown.append(f"seconds={self.seconds:g}" if self.seconds is not None else f"holds={self.holds!r}")
        return f"Unique({', '.join(shown)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Unique):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[Any, ...]:
        return (self.fields, self.key, self.holds, self.seconds)

    def check_fields(self, known: Iterable[str] | None, what: str) -> None:
        """``TypeError`` for a field not among ``known`` (a dataclass's fields, a function's parameters)."""
        check_known_fields("Unique()", self.fields, known, what)

    def key_of(self, name: str, values: Mapping[str, Any], scope: str = "") -> UniqueKey:
        """The key of a job named ``name`` whose payload (a task's arguments) is ``values``; ``QueueError`` if none.

        ``scope``: where the key holds (a database queue's name: each queue of a table has its own keys).
        """
        digest = key_digest("unique key", name, values, fields=self.fields, key=self.key, scope=scope)
        return UniqueKey(digest, "seconds" if self.seconds is not None else str(self.holds), self.seconds)


class UniqueKey(NamedTuple):
    """One dispatch's key, as the stores take it: the SHA-256 (hex) of the job's NAME and key."""

    digest: str
    #: "queued", "unfinished" or "seconds".
    holds: str
    seconds: float | None


def check_unique(value: object, what: str) -> Unique | None:
    if value is not None and not isinstance(value, Unique):
        raise TypeError(f"{what} must be a syncjobs.Unique(...) or None, got {value!r}")
    return value
