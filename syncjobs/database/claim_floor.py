"""Where a claim starts reading the queue: past the rows this process has already claimed.

PostgreSQL keeps the index entry of every claimed and finished row until
VACUUM reaches the table, and a claim that reads the queue from its oldest
due time steps over all of them: after 300,000 jobs with no vacuum in
between, an empty claim reads some 1,100 index pages (0.8 ms), and a drain
slows as it goes. Autovacuum visits a database at most once a minute, and
not at all where it is off, so the claim must not depend on it.

Every row due before the newest row a claim took was either taken too or is
locked by another claimer; a claim may then start at that row's due time and
skip the dead entries. A ready row can still appear below it: a job whose
dispatching transaction commits late, a retry or delayed job coming due, a
claim rolled back. So the floor holds only while claims come back full, and
at most :data:`FULL_SCAN_EVERY` seconds: a claim that finds fewer rows than
it asked for, and the first claim after that time, read from the start.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

#: The longest a ready row below the floor waits for a claim that reads from the start.
FULL_SCAN_EVERY = 0.25
#: A due time at or below any row's: "read from the start".
FROM_START = -float("inf")
#: The same on MySQL, whose DOUBLE has no infinity (and whose rows cannot hold one).
LOWEST_DOUBLE = -sys.float_info.max


class ClaimFloor:
    """The lowest due time (``run_at``) the next claim of one fetcher reads from; its loop's alone."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every: float = FULL_SCAN_EVERY) -> None:
        self._clock = clock
        self._every = every
        self._floor = FROM_START
        self._full_scan_at = -float("inf")

    def start(self) -> float:
        """The ``run_at`` the next claim starts from: :data:`FROM_START` when it is due to read everything."""
        if self._clock() >= self._full_scan_at:
            self._floor = FROM_START
        return self._floor

    def claimed(self, started: float, due_times: Sequence[float], wanted: int) -> None:
        """A claim that started at ``started`` and asked for ``wanted`` rows took rows due at ``due_times``."""
        if len(due_times) < wanted:
            # Ready rows may lie below the floor, or there are none: either way, from the start next time.
            self._full_scan_at = -float("inf")
            return
        if started == FROM_START:
            self._full_scan_at = self._clock() + self._every
        if due_times:
            self._floor = max(self._floor, *due_times)
