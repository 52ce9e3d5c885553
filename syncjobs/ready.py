"""The in-memory queue's ready jobs: first in, first out, until a job of another priority comes.

Every worker blocks on one ``queue.SimpleQueue`` (C, and lock-free under the
GIL): the hot path of a queue whose jobs all keep the default priority is a
``put`` and a ``get``. The first job of another priority turns the queue
ranked for good: jobs then wait in a heap by (priority, arrival) under a
lock, and the ``SimpleQueue`` carries one token per job in the heap, so that
the workers still block there and a token always finds a job.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading

from .envelope import Envelope
from .job import DEFAULT_PRIORITY


class _Token:
    """On the ``SimpleQueue``: "take the first job of the heap" (ranked) or "wake up" (never a job)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_RANKED = _Token("ranked")
_WAKE = _Token("wake")


class ReadyQueue:
    """Jobs due to run, higher priority first, then in the order they became due."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[Envelope | _Token] = queue.SimpleQueue()
        # (-priority, arrival, envelope): the heap pops the highest priority, then the earliest.
        self._heap: list[tuple[int, int, Envelope]] | None = None
        self._arrivals = itertools.count()
        self._lock = threading.Lock()

    def put(self, envelope: Envelope) -> None:
        if self._heap is None and envelope.priority == DEFAULT_PRIORITY:
            self._items.put(envelope)
            return
        with self._lock:
            heap = self._heap
            if heap is None:
                heap = self._heap = self._rank_waiting()
            heapq.heappush(heap, (-envelope.priority, next(self._arrivals), envelope))
        self._items.put(_RANKED)

    def _rank_waiting(self) -> list[tuple[int, int, Envelope]]:
        """The jobs already waiting, moved to a new heap in their order; a token for each. Under the lock."""
        heap: list[tuple[int, int, Envelope]] = []
        wakes = 0
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Envelope):
                heap.append((-item.priority, next(self._arrivals), item))
            else:
                wakes += 1
        heapq.heapify(heap)
        for _ in range(len(heap)):
            self._items.put(_RANKED)
        for _ in range(wakes):
            self._items.put(_WAKE)
        return heap

    def wake(self) -> None:
        """Wake one blocked :meth:`get` (it returns None)."""
        self._items.put(_WAKE)

    def get(self) -> Envelope | None:
        """Block until a job is ready and take it; None for a wake-up."""
        item = self._items.get()
        if item is _WAKE:
            return None
        # A token means the heap, whatever _heap reads: a put() turning the queue ranked puts
        # the tokens of the jobs it moved before it sets _heap, under the lock taken below.
        if item is not _RANKED and self._heap is None:
            return item  # type: ignore[return-value]
        with self._lock:
            heap = self._heap
            if heap is None:  # a token is put only once _heap is set, under this lock
                raise RuntimeError("a ranked token with no heap")
            if isinstance(item, Envelope):
                # Put on the SimpleQueue by a put() that raced the turn to ranked: it ranks now.
                heapq.heappush(heap, (-item.priority, next(self._arrivals), item))
            return heapq.heappop(heap)[2]
