"""Where a claim starts reading the queue: past the rows this process has already claimed.

PostgreSQL keeps the index entry of every claimed and finished row until
VACUUM reaches the table, and a claim that reads the queue from its first
ready row steps over all of them: after 300,000 jobs with no vacuum in
between, an empty claim reads some 1,100 index pages (0.8 ms), and a drain
slows as it goes. Autovacuum visits a database at most once a minute, and
not at all where it is off, so the claim must not depend on it.

A claim takes rows in the order of the claim index: priority (highest
first), then due time. Every row before the last row a claim took was
either taken too or is locked by another claimer; the next claim may then
read from that row on, among the rows of its priority, and skip the dead
entries. A ready row can still appear before it: a job of a higher priority
dispatched since, one whose dispatching transaction commits late, a retry
or delayed job coming due, a claim rolled back. So the floor holds only
while claims come back full, and at most :data:`FULL_SCAN_EVERY` seconds: a
claim that finds fewer rows than it asked for (the rows of that priority
are drained), and the first claim after that time, read from the start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

#: The longest a ready row before the floor waits for a claim that reads from the start.
FULL_SCAN_EVERY = 0.25

#: A row's place in the claim's order: its priority and its due time (``run_at``).
Place = tuple[int, float]


class ClaimFloor:
    """Where the next claim of one fetcher reads from; its loop's alone."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every: float = FULL_SCAN_EVERY) -> None:
        self._clock = clock
        self._every = every
        # The furthest place taken, as (-priority, run_at): in the claim's order, the largest.
        self._floor: tuple[int, float] | None = None
        self._full_scan_at = -float("inf")

    def start(self) -> Place | None:
        """The place the next claim reads from (the rows of that priority, from that due time); None: from the start."""
        if self._clock() >= self._full_scan_at:
            self._floor = None
        if self._floor is None:
            return None
        rank, due = self._floor
        return -rank, due

    def claimed(self, started: Place | None, taken: Sequence[Place], wanted: int) -> None:
        """A claim that started at ``started`` and asked for ``wanted`` rows took rows at the places ``taken``."""
        if len(taken) < wanted:
            # Ready rows may lie before the floor, or there are none: either way, from the start next time.
            self._full_scan_at = -float("inf")
            return
        if started is None:
            self._full_scan_at = self._clock() + self._every
        if taken:
            furthest = max((-priority, due) for priority, due in taken)
            self._floor = furthest if self._floor is None else max(self._floor, furthest)
