"""Periodic jobs: when a schedule's slots fall, as instants (epoch seconds), whatever the time zone does.

A cron expression names wall-clock times in the schedule's time zone; each is
one slot, run once: a time the clock repeats (the hour after daylight saving
ends) runs at its first occurrence, and a time the clock skips (the hour
daylight saving begins) runs as if the clock had not moved (02:30 at 03:30).
An interval (``every=``) counts elapsed seconds from the Unix epoch, so its
slots are the same instants in every process, and no time zone moves them.
Cron expressions are parsed and stepped by ``croniter`` (the ``cron`` extra).
"""

from __future__ import annotations

import datetime
import math
import time
import zoneinfo
from collections.abc import Iterator
from typing import Any, Literal, TypedDict

CatchUp = Literal["skip", "once", "all"]
_CATCH_UPS: tuple[str, ...] = ("skip", "once", "all")

#: Seconds after its time a slot still runs as on time; older ones were missed (see ``catch_up``).
DEFAULT_GRACE = 60.0
#: The most missed slots ``catch_up="all"`` runs (the latest ones).
MAX_CATCH_UP = 1000
_DAY = 86_400.0


class When(TypedDict, total=False):
    """:class:`Schedule`'s arguments, as ``queue.schedule(name, job, **when)`` and the integrations take them."""

    cron: str
    every: float | datetime.timedelta
    tz: str
    catch_up: CatchUp
    grace: float


def _croniter() -> Any:
    try:
        from croniter import croniter  # noqa: PLC0415 - an optional extra, imported only by cron schedules
    except ImportError as exc:
        raise ImportError(
            "cron schedules need croniter: install syncjobs' 'cron' extra (pip install 'syncjobs[cron]')"
        ) from exc
    return croniter


class Schedule:
    """When a periodic job runs: ``Schedule(cron="0 3 * * *", tz="Europe/Paris")`` or ``Schedule(every=300)``.

    ``catch_up``: what becomes of the slots missed while no worker was up
    (found more than ``grace`` seconds after their time): ``"once"`` (the
    default) runs one job for the latest of them, ``"skip"`` none, ``"all"``
    one per slot (the latest :data:`MAX_CATCH_UP`).
    """

    __slots__ = ("_zone", "catch_up", "cron", "every", "grace", "tz")

    def __init__(
        self,
        *,
        cron: str | None = None,
        every: float | datetime.timedelta | None = None,
        tz: str = "UTC",
        catch_up: CatchUp = "once",
        grace: float = DEFAULT_GRACE,
    ) -> None:
        if (cron is None) == (every is None):
            raise TypeError("Schedule(): give cron= (an expression) or every= (seconds), one of them")
        if cron is not None and (not isinstance(cron, str) or not _croniter().is_valid(cron)):
            raise TypeError(f"Schedule(): cron={cron!r} is not a cron expression (such as '0 3 * * *')")
        if every is not None:
            seconds = every.total_seconds() if isinstance(every, datetime.timedelta) else every
            # Whole seconds: slots are then exact multiples, the same in every process.
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, (int, float))
                or not 1 <= seconds < math.inf
                or seconds != int(seconds)
            ):
                raise TypeError(f"Schedule(): every= must be a whole number of seconds, at least 1, got {every!r}")
            every = float(seconds)
        try:
            self._zone = zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            raise TypeError(f"Schedule(): tz={tz!r} is not a time zone name (such as 'Europe/Paris')") from exc
        if catch_up not in _CATCH_UPS:
            raise TypeError(f"Schedule(): catch_up must be 'skip', 'once' or 'all', got {catch_up!r}")
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 < grace < math.inf:
            raise TypeError(f"Schedule(): grace must be seconds > 0, got {grace!r}")
        self.cron = cron
        self.every: float | None = every
        self.tz = tz
        self.catch_up: CatchUp = catch_up
        self.grace = float(grace)
        if cron is not None:
            try:
                self.next_after(time.time())
            except Exception as exc:  # noqa: BLE001 - croniter's own, for a date that never comes (30 February)
                raise TypeError(f"Schedule(): cron={cron!r} names no time that comes: {exc}") from None

    def __repr__(self) -> str:
        when = f"cron={self.cron!r}, tz={self.tz!r}" if self.cron is not None else f"every={self.every:g}"
        return f"Schedule({when}, catch_up={self.catch_up!r})"

    def describe(self) -> str:
        """``cron 0 3 * * * (Europe/Paris)`` or ``every 300s``: how ``syncjobs schedules`` shows it."""
        return f"cron {self.cron} ({self.tz})" if self.cron is not None else f"every {self.every:g}s"

    # -- slots ------------------------------------------------------------------

    def slots(self, after: float, until: float) -> Iterator[float]:
        """The slots ``s`` with ``after < s <= until``, in order."""
        if self.every is not None:
            step = int(self.every)
            number = math.floor(after) // step + 1
            while number * step <= until:
                yield float(number * step)
                number += 1
            return
        # From the wall time ``after`` had a day earlier, if that is earlier: on the day the clock
        # springs forward, a time it skipped (02:30, run at 03:30) is behind ``after``'s own wall time.
        local = min(self._naive(after), self._naive(after - _DAY) + datetime.timedelta(days=1))
        steps = _croniter()(self.cron, local)
        previous = after
        while True:
            slot = self._instant(steps.get_next(datetime.datetime))
            if slot <= previous:
                continue  # a skipped hour's time, mapped onto one that comes anyway
            if slot > until:
                return
            yield slot
            previous = slot

    def next_after(self, moment: float) -> float:
        """The first slot after ``moment``."""
        return next(self.slots(moment, math.inf))

    def latest(self, after: float, until: float, count: int) -> list[float]:
        """The last ``count`` slots ``s`` with ``after < s <= until``, in order (without stepping through the rest)."""
        found: list[float] = []
        if self.every is not None:
            step = int(self.every)
            number = math.floor(until) // step
            while number * step > after and len(found) < count:
                found.append(float(number * step))
                number -= 1
            return found[::-1]
        # From the wall time ``until`` had a day earlier, if that is later: in the hour the clock
        # repeats, a slot of its first pass is ahead of ``until``'s wall time in the second.
        wall = max(self._naive(until), self._naive(until - _DAY) + datetime.timedelta(days=1))
        steps = _croniter()(self.cron, wall + datetime.timedelta(microseconds=1))
        while len(found) < count:
            slot = self._instant(steps.get_prev(datetime.datetime))
            if slot > until or (found and slot >= found[-1]):
                continue  # a skipped hour's time mapped past ``until``, or onto a later one
            if slot <= after:
                break
            found.append(slot)
        return found[::-1]

    def local(self, slot: float) -> datetime.datetime:
        """The slot as an aware datetime in the schedule's time zone."""
        return datetime.datetime.fromtimestamp(slot, self._zone)

    def _naive(self, moment: float) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(moment, self._zone).replace(tzinfo=None)

    def _instant(self, wall: datetime.datetime) -> float:
        # fold=0: a repeated time is its first occurrence; a skipped one takes
        # the offset from before the change, which puts it as much later.
        return wall.replace(tzinfo=self._zone, fold=0).timestamp()
