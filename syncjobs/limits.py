"""Concurrency and rate limits: how many runs of a kind of job may go on at once, and how often one may begin.

``LIMIT = Limit(running=2)`` on a job class (``limit=`` on a task): at most
two of its runs at once, across every worker process of the queue.
``Limit("tenant_id", running=2)``: two per tenant. ``Limit(rate="100/m")``:
runs begin at most 100 a minute, evenly spaced (one every 0.6 s, no bursts:
Celery's rate limits mean the same). Both may be given.

A job over its limit is not failed and does not spin: it waits, and a run
of its key that ends lets the next one go (by priority, then due time); a
job over its rate is due again at the moment its turn comes. Each store
enforces it where every worker meets: a lock in memory, the claim's
transaction in a database (``database/permits.py``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .job_keys import KeyFunction, check_key_spec, check_known_fields, key_digest

#: "100/m", "5/s", "1000/h", "10/d", or a period of several units: "3/10s".
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> float:
    """Seconds between two runs' starts for a rate such as ``"100/m"``; ``TypeError`` for anything else."""
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None or int(match[1]) < 1 or match[2] == "0":
        raise TypeError(
            f"Limit(): rate must be a count per period, such as '100/m', '5/s', '1000/h' or '3/10s', got {rate!r}"
        )
    period = int(match[2] or 1) * _UNIT_SECONDS[match[3]]
    return period / int(match[1])


class Limit:
    """A job's concurrency and rate limit: ``LIMIT = Limit(running=2)`` on a class, ``limit=`` on a task.

    ``running=N``: at most N runs at once. ``rate="100/m"``: at most 100 runs
    begin a minute, one every 0.6 s. Per job NAME; with payload fields (a
    task's parameters) or ``key=`` (a function of the payload), per value of
    them: ``Limit("tenant_id", running=2)`` lets each tenant run two at once.
    """

    __slots__ = ("_per_name", "fields", "interval", "key", "rate", "running")

    def __init__(
        self,
        *fields: str,
        key: KeyFunction | None = None,
        running: int | None = None,
        rate: str | None = None,
    ) -> None:
        check_key_spec("Limit()", fields, key)
        if running is not None and (isinstance(running, bool) or not isinstance(running, int) or running < 1):
            raise TypeError(f"Limit(): running must be an int >= 1, got {running!r}")
        if running is None and rate is None:
            raise TypeError("Limit(): give running= (runs at once), rate= (runs begun per period), or both")
        self.fields: tuple[str, ...] = fields
        self.key = key
        self.running = running
        self.rate = rate
        #: Seconds between two runs' starts (None: no rate limit).
        self.interval: float | None = None if rate is None else parse_rate(rate)
        #: The key of each (NAME, scope), where it does not depend on the payload.
        self._per_name: dict[tuple[str, str], LimitKey] = {}

    def __repr__(self) -> str:
        shown = [repr(field) for field in self.fields]
        if self.key is not None:
            shown.append(f"key={self.key!r}")
        if self.running is not None:
            shown.append(f"running={self.running}")
        if self.rate is not None:
            shown.append(f"rate={self.rate!r}")
        return f"Limit({', '.join(shown)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Limit):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[Any, ...]:
        return (self.fields, self.key, self.running, self.interval)

    def check_fields(self, known: Iterable[str] | None, what: str) -> None:
        """``TypeError`` for a field not among ``known`` (a dataclass's fields, a function's parameters)."""
        check_known_fields("Limit()", self.fields, known, what)

    def key_of(self, name: str, values: Mapping[str, Any], scope: str = "") -> LimitKey:
        """The limit key of a job named ``name`` whose payload is ``values``; ``QueueError`` if none can be made."""
        if not self.fields and self.key is None:
            # One key for every job of the NAME (not the whole payload, as for Unique): made once.
            made = self._per_name.get((name, scope))
            if made is None:
                digest = key_digest("limit key", name, {}, fields=(), key=None, scope=scope)
                made = self._per_name[name, scope] = LimitKey(digest, self.running, self.interval)
            return made
        digest = key_digest("limit key", name, values, fields=self.fields, key=self.key, scope=scope)
        return LimitKey(digest, self.running, self.interval)


@dataclasses.dataclass(frozen=True)
class LimitRow:
    """A limit key in use, and its permits now: what the dashboard's limits page lists."""

    queue: str
    #: The key's SHA-256 (hex): no store keeps the key itself.
    key: str
    #: Runs at once the key allows (None: a rate limit only).
    running_limit: int | None
    #: A job name among those with a permit of the key (None: none has one now).
    job_name: str | None
    #: Jobs running (or let go, about to) under the key.
    running: int
    #: Jobs waiting for a permit.
    waiting: int
    #: Jobs with a rate's turn booked, due then.
    booked: int
    #: Seconds until the rate lets the next run begin (negative: it would now).
    next_in: float


class LimitKey(NamedTuple):
    """One job's limit, as the stores take it: its key's SHA-256 (hex), and the limits that key has."""

    digest: str
    #: Runs at once (None: any number).
    running: int | None
    #: Seconds between two runs' starts (None: no rate limit).
    interval: float | None


def check_limit(value: object, what: str) -> Limit | None:
    if value is not None and not isinstance(value, Limit):
        raise TypeError(f"{what} must be a syncjobs.Limit(...) or None, got {value!r}")
    return value


class Turn(NamedTuple):
    """A rate's answer to a job claimed ``now``, and the rate's schedule after it."""

    #: Whether it may begin now; if not, it is due again at ``at``.
    begins: bool
    at: float
    #: The earliest the next run may begin, and the first turn not yet booked.
    next_at: float
    booked_until: float


def rate_turn(now: float, next_at: float, booked_until: float, interval: float, *, booked_at: float | None) -> Turn:
    """Runs begin one ``interval`` apart at least: may a job claimed ``now`` begin, or when is its turn.

    A turn not taken is not saved up (no bursts after a quiet spell). A job
    that must wait books the first turn not yet booked, so that those waiting
    begin in the order they came, each once. One claimed at its booked turn
    (``booked_at``) after another run began a moment before it waits only for
    the next moment a run may begin; one whose turn passed long ago (its
    workers were busy, or down) books a new turn, behind those booked since.
    """
    if now >= next_at:
        after = now + interval
        return Turn(True, now, after, max(booked_until, after))
    if booked_at is not None and booked_at >= now - interval:
        return Turn(False, next_at, next_at, booked_until)
    turn = max(booked_until, next_at)
    return Turn(False, turn, next_at, turn + interval)
