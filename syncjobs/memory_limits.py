"""The in-memory backend's limits: permits by key under one lock, the jobs over them waiting beside the queue.

A claimed job with a limit key asks :meth:`MemoryLimits.admit`: it runs if
its key has a permit free and no job waits on it before this one (and, under
a rate, its turn has come); else it waits here, out of the ready queue (over
``running``), or in the timer heap until its turn (over the rate). A run that
ends gives its permit back, and the first job waiting on its key (by
priority, then arrival) goes back to the ready queue with a permit kept for
it: waiting costs nothing until then. The same rules as a database's
(``database/permits.py``).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable

from .envelope import Envelope
from .limits import LimitKey, LimitRow, rate_turn

#: Keys before those nothing needs any more are forgotten (then twice as many as are still needed).
_FORGET_AT = 1_000


class _Key:
    """One limit key's runs, the jobs waiting for a permit or let go with one kept, and its rate's schedule."""

    __slots__ = ("booked", "booked_until", "holders", "kept", "next_at", "running", "waiting")

    def __init__(self) -> None:
        #: Runs at once (as the last claim's class had it), and how many jobs have a rate's turn booked.
        self.running: int | None = None
        self.booked = 0
        self.holders: set[str] = set()
        self.kept: set[str] = set()
        self.waiting: list[tuple[int, int, Envelope]] = []
        self.next_at = float("-inf")
        self.booked_until = float("-inf")

    def free(self) -> bool:
        return self.running is None or len(self.holders) + len(self.kept) < self.running

    def needed(self, now: float) -> bool:
        """Whether anything holds, waits on or has a turn booked with it, or its rate's schedule still counts."""
        return bool(self.holders or self.kept or self.waiting or self.booked) or self.booked_until > now


class MemoryLimits:
    def __init__(
        self,
        clock: Callable[[], float],
        ready: Callable[[Envelope], None],
        later: Callable[[float, Envelope], object],
    ) -> None:
        self._clock = clock
        #: Puts a job back on the ready queue; ``later(due, job)`` parks one until the clock reads ``due``.
        self._ready = ready
        self._later = later
        self._keys: dict[str, _Key] = {}
        self._forget_at = _FORGET_AT
        #: The key of each job that holds a permit, by job id (what an end gives back).
        self._held: dict[str, str] = {}
        #: Jobs let go with a permit kept for them (their key), and with a rate's turn booked (key, turn).
        self._kept: dict[str, str] = {}
        self._booked: dict[str, tuple[str, float]] = {}
        self._arrivals = itertools.count()
        self._lock = threading.Lock()

    def admit(self, envelope: Envelope, limit: LimitKey) -> bool:
        """Whether the claimed ``envelope`` may run now; if not, it waits here or in the timer heap."""
        job_id = envelope.id
        with self._lock:
            kept = self._unkeep(job_id, limit.digest)
            booked = self._booked.pop(job_id, None)
            if booked is not None:
                self._keys[booked[0]].booked -= 1
            key = self._key(limit)
            its_turn = kept or booked is not None  # it has waited its turn already
            if limit.running is not None and (not key.free() or (key.waiting and not its_turn)):
                heapq.heappush(key.waiting, (-envelope.priority, next(self._arrivals), envelope))
                return False
            if limit.interval is not None:
                now = self._clock()
                booked_at = None if booked is None else booked[1]
                turn = rate_turn(now, key.next_at, key.booked_until, limit.interval, booked_at=booked_at)
                key.next_at, key.booked_until = turn.next_at, turn.booked_until
                if not turn.begins:
                    self._booked[job_id] = (limit.digest, turn.at)
                    key.booked += 1
                    self._later(turn.at, envelope)
                    if kept:  # the permit kept for it goes to the next
                        self._let_next_go(limit.digest, key)
                    return False
            if limit.running is not None:
                key.holders.add(job_id)
                self._held[job_id] = limit.digest
        return True

    def _key(self, limit: LimitKey) -> _Key:
        """Under the lock: the key's state, made if need be (and, as keys grow, those not needed forgotten)."""
        key = self._keys.get(limit.digest)
        if key is None:
            if len(self._keys) >= self._forget_at:
                now = self._clock()
                self._keys = {digest: each for digest, each in self._keys.items() if each.needed(now)}
                self._forget_at = max(_FORGET_AT, 2 * len(self._keys))
            key = self._keys[limit.digest] = _Key()
        key.running = limit.running
        return key

    def _unkeep(self, job_id: str, digest: str) -> bool:
        """Under the lock: whether a permit was kept for ``job_id``; that key's next goes if it was another's."""
        kept_on = self._kept.pop(job_id, None)
        if kept_on is None:
            return False
        key = self._keys[kept_on]
        key.kept.discard(job_id)
        if kept_on != digest:  # its key changed meanwhile (a key= function's answer): the old one's place is free
            self._let_next_go(kept_on, key)
            return False
        return True

    def in_use(self, queue: str, name_of: Callable[[str], str | None]) -> list[LimitRow]:
        """The keys anything holds, waits on or has a turn booked with, now; ``name_of(job_id)``: a job's name."""
        with self._lock:  # copies only: the names are looked up after, without the lock
            booked_by_key: dict[str, list[str]] = {}
            for job_id, (digest, _) in self._booked.items():
                booked_by_key.setdefault(digest, []).append(job_id)
            taken = [
                (
                    digest,
                    [*key.holders, *key.kept],
                    [waiting[2].id for waiting in key.waiting],
                    key.running,
                    key.booked,
                    key.next_at,
                )
                for digest, key in self._keys.items()
                if key.holders or key.kept or key.waiting or key.booked
            ]
        now = self._clock()
        rows = []
        for digest, holding, waiting, running, booked, next_at in taken:
            ids = (*holding, *waiting, *booked_by_key.get(digest, ()))
            name = next((found for job_id in ids if (found := name_of(job_id)) is not None), None)
            next_in = next_at - now if next_at > float("-inf") else 0.0
            rows.append(LimitRow(queue, digest, running, name, len(holding), len(waiting), booked, next_in))
        return sorted(rows, key=lambda row: row.key)

    def ended(self, envelope: Envelope) -> None:
        """The run of ``envelope`` ended (or it went back to wait): its permit goes to the next job waiting."""
        if not self._held:  # no job of this store holds one: the cost of a store without limits
            return
        with self._lock:
            digest = self._held.pop(envelope.id, None)
            if digest is None:
                return
            key = self._keys[digest]
            key.holders.discard(envelope.id)
            self._let_next_go(digest, key)

    def dropped(self, envelope: Envelope) -> None:
        """``envelope`` was cancelled before its run: a permit kept for it goes to the next, its booking is void."""
        if not (self._kept or self._booked):
            return
        with self._lock:
            booked = self._booked.pop(envelope.id, None)
            if booked is not None:
                self._keys[booked[0]].booked -= 1
            self._unkeep(envelope.id, "")

    def _let_next_go(self, digest: str, key: _Key) -> None:
        """Under the lock: the first jobs waiting on ``key``, one a free permit, back to the ready queue."""
        while key.waiting and key.free():
            envelope = heapq.heappop(key.waiting)[2]
            key.kept.add(envelope.id)
            self._kept[envelope.id] = digest
            self._ready(envelope)
