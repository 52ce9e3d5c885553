"""The database store's background threads: the outcome writer, the heartbeat and the listener.

Each runs in a :class:`Loop`, with a stop event of its own: a store opened
again gets new loops, and a loop of the last ``open()`` that has not yet left
still sees itself stopped. They reach the database only through a
:class:`Database` (``run`` / ``transaction`` with a deadline).

Leases: the heartbeat renews only the tokens in :class:`Leases`, the rows
this process still holds (claimed, and not yet written back or given up). A
row whose claim committed but never reached us, or whose outcome could not
be written for a whole lease, is not renewed: its lease expires and another
fetch pass recovers it, so no row stays ``running`` while its worker lives.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from ..envelope import ClaimedEnvelope
from ..status import Progress

logger = logging.getLogger("syncjobs.database")

T = TypeVar("T")

#: How long the outcome writer waits between two tries of a write that failed.
RETRY_PAUSE = 0.5
#: How often at most an outcome writer that coalesces writes: the outcomes of
#: a stream of short jobs then share one commit. One after a quiet spell is
#: written at once.
WRITE_COALESCE = 0.01
#: The listener's connection must answer a query this often, within this many seconds.
LISTENER_CHECK_EVERY = 5.0
LISTENER_CHECK_WITHIN = 5.0


class Database(Protocol):
    def run(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T: ...

    def transaction(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T: ...


class Loop:
    """One background thread and its own stop event."""

    def __init__(self, name: str, body: Callable[[threading.Event], None], wake: Callable[[], None] | None = None):
        self.stopping = threading.Event()
        self._wake = wake
        self.thread = threading.Thread(target=body, args=(self.stopping,), name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._wake is not None:
            self._wake()

    def join(self, deadline: float) -> bool:
        """Wait until the thread has left or the monotonic ``deadline`` passes; whether it has left."""
        if self.thread.ident is None:  # never started: open() failed before it
            return True
        self.thread.join(max(0.0, deadline - time.monotonic()))
        return not self.thread.is_alive()


class Leases:
    """The lease tokens of the rows this process holds, counted per envelope."""

    def __init__(self) -> None:
        self._held: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def hold(self, tokens: Iterable[str | None]) -> None:
        with self._lock:
            held = self._held
            for token in tokens:
                if token is not None:
                    held[token] += 1

    def drop(self, tokens: Iterable[str | None]) -> None:
        with self._lock:
            held = self._held
            for token in tokens:
                if token is None:
                    continue
                held[token] -= 1
                if held[token] <= 0:
                    del held[token]

    def tokens(self) -> list[str]:
        with self._lock:
            return list(self._held)


class Heartbeat:
    """Renews the held leases every third of a lease, with ``also(cursor)`` in the same round trip.

    Stopped, it runs ``down(cursor)`` once, by :attr:`leave_by` (what close() sets).
    """

    def __init__(
        self,
        db: Database,
        leases: Leases,
        *,
        renew: Callable[[Any, list[str]], None],
        also: Callable[[Any], None],
        down: Callable[[Any], None] | None,
        lease: float,
        owner: str,
    ) -> None:
        self._db = db
        self._leases = leases
        self._renew = renew
        self._also = also
        self._down = down
        self.leave_by: float | None = None
        self._interval = lease / 3
        self._owner = owner

    def loop(self, stopping: threading.Event) -> None:
        # The first beat at once: its connection is open before it is needed
        # at close (a connect into a dead path could not be interrupted).
        wait = 0.0
        while not stopping.wait(wait):
            wait = self._interval
            try:
                self._db.run(self._beat, deadline=self._interval)
            except Exception:
                if stopping.is_set():
                    return
                logger.exception("renewing the leases of worker %s failed; trying again", self._owner)
        left = self._interval if self.leave_by is None else self.leave_by - time.monotonic()
        if self._down is not None and left > 0:
            try:
                self._db.run(self._down, deadline=left)
            except Exception:  # only stats read the row; it lapses with its heartbeat anyway
                logger.debug("could not remove worker %s from the live workers", self._owner, exc_info=True)

    def _beat(self, cursor: Any) -> None:
        tokens = self._leases.tokens()
        if tokens:
            self._renew(cursor, tokens)
        self._also(cursor)


@dataclasses.dataclass(eq=False)
class _Write:
    """One outcome to write: a completion (``sql`` None, deleted in a batch) or a fenced UPDATE."""

    envelope: ClaimedEnvelope
    sql: str | None
    params: tuple[Any, ...]
    #: Monotonic time after which the write is given up (the lease left to expire).
    give_up: float
    #: A worker's outcome, reported settled once written or given up (not a row claimed for no one).
    taken: bool = True
    #: Set once written or given up, where someone waits for it.
    done: threading.Event | None = None
    failures: int = 0


class OutcomeWriter:
    """Writes every outcome from its own thread, so that no worker waits on the database for long.

    Completions are deleted in batches (one commit for many jobs); with
    ``coalesce``, a writer that wrote less than that many seconds ago waits
    out the rest, so that more completions share the commit, unless a worker
    waits for one of the writes. A write that
    fails is tried again until it lands or a lease has passed since the run
    ended; then its token is dropped from :class:`Leases`, the lease expires,
    and the job runs again (at-least-once).
    """

    def __init__(
        self,
        db: Database,
        leases: Leases,
        *,
        complete: Callable[[list[ClaimedEnvelope], float], int],
        lease: float,
        settled: Callable[[list[ClaimedEnvelope]], None] = lambda envelopes: None,
        coalesce: float = 0.0,
    ) -> None:
        self._db = db
        self._coalesce = coalesce
        self._leases = leases
        #: Writes the completions of a batch as one commit, within a timeout; how many rows it deleted.
        self._complete = complete
        self._lease = lease
        #: Told, a batch at a time, of the taken envelopes whose outcomes were written or given up.
        self._settled = settled
        # Each try's own bound: short enough to see a stop and give-ups in time.
        self._try_bound = min(lease / 3, 5.0)
        self._cond = threading.Condition()
        self._queue: collections.deque[_Write] = collections.deque()
        self._retry: list[_Write] = []
        #: Set by close(): the writes still queued then get until this monotonic time.
        self.flush_deadline: float | None = None

    # -- from the workers -----------------------------------------------------

    #: How long a worker waits for its write (the writer goes on after).
    @property
    def try_bound(self) -> float:
        return self._try_bound

    def complete(self, envelope: ClaimedEnvelope) -> None:
        self._put(_Write(envelope, None, (), time.monotonic() + self._lease))

    def write(
        self, envelope: ClaimedEnvelope, sql: str, params: tuple[Any, ...], *, wait: float, taken: bool = True
    ) -> None:
        """Queue a fenced UPDATE and wait up to ``wait`` seconds for it to land (it goes on after).

        ``taken=False``: a row claimed for no worker, not reported settled.
        """
        done = threading.Event() if wait > 0 else None
        self._put(_Write(envelope, sql, params, time.monotonic() + self._lease, taken, done))
        if done is not None:
            done.wait(wait)

    def _put(self, item: _Write) -> None:
        with self._cond:
            self._queue.append(item)
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the thread -----------------------------------------------------------

    def loop(self, stopping: threading.Event) -> None:
        retry: list[_Write] = []
        last_write = -math.inf
        while True:
            with self._cond:
                if not self._queue:
                    if stopping.is_set() and not retry:
                        return
                    self._cond.wait(self._pause(stopping) if retry else None)
                # A worker waiting for its write (a retry parked, a dead letter) is not kept waiting.
                gather = self._coalesce > 0 and not any(item.done is not None for item in self._queue)
            if gather:
                stopping.wait(last_write + self._coalesce - time.monotonic())
            with self._cond:
                batch = [*retry, *self._queue]
                self._queue.clear()
            if not batch:
                continue
            last_write = time.monotonic()
            deadline = self._deadline(stopping)
            if deadline <= 0:
                self._leave(batch)
                return
            retry = self._give_up_expired(self._write_all(batch, deadline))

    def _pause(self, stopping: threading.Event) -> float:
        """How long to wait before trying failed writes again: never past close()'s flush."""
        return min(RETRY_PAUSE, self._deadline(stopping))

    def _deadline(self, stopping: threading.Event) -> float:
        """Each try's bound: its own, or what is left of close()'s flush."""
        if not stopping.is_set() or self.flush_deadline is None:
            return self._try_bound
        return max(0.0, self.flush_deadline - time.monotonic())

    def _write_all(self, batch: list[_Write], deadline: float) -> list[_Write]:
        """Write ``batch`` (completions in one transaction); the writes that failed."""
        completions = [item for item in batch if item.sql is None]
        failed: list[_Write] = []
        if completions:
            try:
                deleted = self._complete([item.envelope for item in completions], deadline)
            except Exception as exc:  # noqa: BLE001 - kept and tried again
                self._failed(completions, exc)
                failed.extend(completions)
            else:
                if deleted < len(completions):
                    logger.warning(
                        "%d of %d finished job(s) had lost their lease (they ran too long or this worker stalled); "
                        "their rows belong to another worker now and are left to it",
                        len(completions) - deleted,
                        len(completions),
                    )
                self._settle(completions)
        for item in batch:
            if item.sql is None:
                continue
            sql, params = item.sql, item.params

            def execute(cursor: Any, sql: str = sql, params: tuple[Any, ...] = params) -> int:
                cursor.execute(sql, params)
                if cursor.description is not None:  # a write that also notifies: it selects the rows it changed
                    return int(cursor.fetchone()[0])
                return int(cursor.rowcount)

            try:
                changed = self._db.run(execute, deadline=deadline)
            except Exception as exc:  # noqa: BLE001 - kept and tried again
                self._failed([item], exc)
                failed.append(item)
                continue
            if changed == 0:
                envelope = item.envelope
                logger.warning(
                    "job %s (%s): its lease was lost (it ran too long or this worker stalled); "
                    "the row belongs to another worker now and is left to it",
                    envelope.name,
                    envelope.id,
                    extra=_extra(envelope),
                )
            self._settle([item])
        return failed

    def _failed(self, items: list[_Write], exc: Exception) -> None:
        for item in items:
            item.failures += 1
            if item.failures == 1:
                envelope = item.envelope
                logger.warning(
                    "job %s (%s): its outcome could not be written (%s); trying again in the background "
                    "for up to %.3gs, after which its lease expires and it runs again",
                    envelope.name,
                    envelope.id,
                    exc,
                    max(0.0, item.give_up - time.monotonic()),
                    extra=_extra(envelope),
                )

    def _give_up_expired(self, failed: list[_Write]) -> list[_Write]:
        now = time.monotonic()
        kept = []
        expired = []
        for item in failed:
            if now < item.give_up:
                kept.append(item)
                continue
            envelope = item.envelope
            logger.error(
                "job %s (%s): its outcome could not be written for %.3gs; given up: its lease will expire "
                "and the job run again",
                envelope.name,
                envelope.id,
                self._lease,
                extra=_extra(envelope),
            )
            expired.append(item)
        self._settle(expired)
        return kept

    def _leave(self, items: list[_Write]) -> None:
        """Shutting down with no time left: these are left to their leases."""
        if items:
            logger.warning(
                "shutting down: %d job outcome(s) could not be written in the time left; their leases will "
                "expire and those jobs run again",
                len(items),
            )
        self._settle(items)

    def _settle(self, items: list[_Write]) -> None:
        """Written or given up: the leases are no longer renewed, and waiters and the store are told."""
        if not items:
            return
        self._leases.drop(item.envelope.lease for item in items)
        for item in items:
            if item.done is not None:
                item.done.set()
        taken = [item.envelope for item in items if item.taken]
        if taken:
            self._settled(taken)


class ProgressWriter:
    """Writes what runs report with ``progress()``: each job's latest, at most once every ``every`` seconds.

    Best effort, on its own thread: a write that fails is dropped (the next
    report, or the job's end, writes it again), and no lease depends on it.
    """

    def __init__(self, db: Database, sql: str, every: float = 1.0) -> None:
        self._db = db
        self._sql = sql
        self._every = every
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[Progress, str | None]] = {}
        self._wake = threading.Event()

    def put(self, job_id: str, lease: str | None, progress: Progress) -> None:
        """Keep ``progress`` as the job's latest: cheap, whatever the rate (it is written once a second at most)."""
        with self._lock:
            self._pending[job_id] = (progress, lease)
        if not self._wake.is_set():  # Event.set() takes a lock every worker would share
            self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def loop(self, stopping: threading.Event) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if stopping.is_set():
                return
            self.flush()
            stopping.wait(self._every)

    def flush(self) -> int:
        """Write each job's latest report, one UPDATE a job; how many were written (best effort)."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        try:
            self._db.run(functools.partial(self._write, batch=batch), deadline=self._every * 5)
        except Exception:
            logger.debug("could not write the progress of %d job(s)", len(batch), exc_info=True)
            return 0
        return len(batch)

    def _write(self, cursor: Any, *, batch: dict[str, tuple[Progress, str | None]]) -> None:
        for job_id, (progress, lease) in batch.items():
            cursor.execute(self._sql, (progress.to_json(), job_id, lease))


class Listener:
    """PostgreSQL: LISTEN on the queue's channel, and call ``kick()`` on each NOTIFY.

    A connection that answers nothing (a silently dead network path, which
    TCP may not notice for minutes) is noticed: every
    :data:`LISTENER_CHECK_EVERY` seconds it must answer a ``SELECT 1`` within
    :data:`LISTENER_CHECK_WITHIN`, or it is dropped and opened again.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        channel: str,
        kick: Callable[[], None],
        poll_interval: float,
        until: Callable[[], bool] | None = None,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._kick = kick
        #: Asked about once a second: True ends the loop (no one needs the notifications any more).
        self._until = until or (lambda: False)
        self._poll_interval = poll_interval
        self._check_every = LISTENER_CHECK_EVERY
        self._check_within = LISTENER_CHECK_WITHIN
        self._conn: Any = None

    def abort(self) -> None:
        """Break the current connection under a thread blocked on it (closing, past the deadline)."""
        conn = self._conn
        if conn is not None:
            abort_connection(conn)

    def loop(self, stopping: threading.Event) -> None:
        while not stopping.is_set() and not self._until():
            try:
                conn = self._conn = self._connect()
            except Exception:
                logger.debug("the notification connection could not be opened", exc_info=True)
                stopping.wait(self._poll_interval)
                continue
            try:
                conn.execute(f'LISTEN "{self._channel}"')
                self._kick()  # what was dispatched while no one listened
                next_check = time.monotonic() + self._check_every
                while not stopping.is_set():
                    for _ in conn.notifies(timeout=min(self._poll_interval, 1.0), stop_after=1):
                        self._kick()
                    if self._until():
                        return
                    if time.monotonic() >= next_check:
                        if not self._answers(conn, stopping):
                            raise ConnectionError(f"no answer within {self._check_within}s")
                        next_check = time.monotonic() + self._check_every
            except Exception:
                if stopping.is_set():
                    return
                logger.info("the notification connection dropped; re-opening it", exc_info=True)
                stopping.wait(min(self._poll_interval, 1.0))
            finally:
                _close_quietly(conn)

    def _answers(self, conn: Any, stopping: threading.Event) -> bool:
        """A cheap query, bounded: the driver has no read timeout, so it runs in a thread we can leave."""
        answered = threading.Event()

        def ping() -> None:
            try:
                conn.execute("SELECT 1")
            except Exception:  # noqa: BLE001 - no answer is the answer
                return
            answered.set()

        thread = threading.Thread(target=ping, name="syncjobs-listener-check", daemon=True)
        thread.start()
        thread.join(self._check_within)
        if answered.is_set():
            return True
        # Unblock the ping: shut the socket down under it. The connection is
        # closed after, and only once the ping has left it.
        abort_connection(conn)
        thread.join()
        return False


def abort_connection(conn: Any) -> None:
    """Wake a thread blocked reading ``conn`` by shutting its socket down; the driver then raises.

    Neither driver can bound a read that never returns (a silent network
    path), nor close a connection another thread is blocked on.
    """
    try:
        # psycopg has fileno(); PyMySQL keeps its socket as _sock.
        fileno = conn.fileno() if hasattr(conn, "fileno") else conn._sock.fileno()
    except Exception:  # noqa: BLE001 - no socket (SQLite), or closed already
        return
    if not isinstance(fileno, int) or fileno < 0:
        return
    try:
        sock = socket.socket(fileno=os.dup(fileno))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        logger.debug("closing the notification connection failed", exc_info=True)


def _extra(envelope: ClaimedEnvelope) -> dict[str, object]:
    return {"job_name": envelope.name, "job_id": envelope.id}
