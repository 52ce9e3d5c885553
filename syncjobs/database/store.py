"""The database store: jobs as rows, claimed in batches under leases.

The fetcher (``fetcher.py``) claims rows for the workers that are waiting
and recovers expired leases; dispatch's inserts are ``intake.py``'s. The outcome writer, the heartbeat (which
renews the leases of the rows this process holds) and, on PostgreSQL, the
listener that wakes the fetcher on NOTIFY are in ``background.py``. Workers
take claimed envelopes from a local queue, so the worker loop is the
in-memory one, unchanged.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from ..envelope import ClaimedEnvelope, Envelope
from ..errors import QueueError
from ..limits import LimitKey
from ..status import JobStatus, Progress
from ..unique import UniqueKey
from . import queries
from .admin import TableAdmin
from .background import WRITE_COALESCE, Heartbeat, Leases, Listener, Loop, OutcomeWriter, ProgressWriter
from .connections import Connections, DatabaseUnavailable, in_transaction
from .dialect import Dialect
from .dialects import MYSQL, POSTGRES, SQLITE, Connector
from .fetcher import CLAIM_COALESCE, Fetcher
from .intake import Intake
from .permits import Permits
from .postgres import notify_channel
from .sqlite import database_file
from .unique_keys import UniqueKeys
from .wakeup import WakeListener, Waker, wake_directory

logger = logging.getLogger("syncjobs.database")

FETCHER_THREAD = "syncjobs-fetcher"
#: PostgreSQL: seconds the LISTEN for job ends stays open with no result() waiting.
ENDS_IDLE = 60.0

# Importable from here too, as before connections.py owned it.
__all__ = ["DatabaseStore", "DatabaseUnavailable"]

T = TypeVar("T")


class DatabaseStore:
    def __init__(
        self,
        connector: Connector,
        *,
        table: str,
        queue: str,
        lease: float,
        poll_interval: float,
        carry: Sequence[contextvars.ContextVar[Any]],
        dispatch_timeout: float,
        prefetch: int = 0,
        workers: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connector = connector
        self.dialect = connector.dialect
        self.table = table
        self.queue = queue
        self.lease = lease
        self.poll_interval = poll_interval
        self.carry = {var.name: var for var in carry}
        self.dispatch_timeout = dispatch_timeout
        #: Worker threads this store feeds; a store with any is listed in ``<table>_workers``.
        self.workers = workers
        self._clock = clock
        # Unique per process start (and per store): leases name their owner.
        self.owner = f"{uuid.uuid4().hex[:12]}"
        self._sql = {name: self.dialect.sql(text, table) for name, text in vars(queries).items() if name.isupper()}
        self._local = threading.local()
        #: This process's connections to the database, shared with the queue's admin.
        self.connections = Connections(connector)
        self._unique_keys = UniqueKeys(self.dialect, table)
        self._permits = Permits(self.dialect, table, queue)
        #: Whether any job class of the queue declares a limit (else housekeeping leaves the limit tables be).
        self._limits_in_use: Callable[[], bool] = lambda: False
        self._fetcher = Fetcher(
            self,
            self._sql,
            self.dialect,
            queue=queue,
            owner=self.owner,
            lease=lease,
            poll_interval=poll_interval,
            prefetch=prefetch,
            carry=self.carry,
            on_dead=self._dead_by_fetcher,
            hold=self._hold,
            prune_keys=self._unique_keys.prune,
            permits=self._permits,
            tend_limits=self._tend_limits,
        )
        self._intake = Intake(self._sql, self.dialect, lambda: self.channel, connector.is_contention)
        self._is_contention = connector.is_contention
        # Each open() builds its own: the leases this process holds, the loops
        # (each with its own stop event), the outcome writer, the listener.
        self._leases = Leases()
        self._loops: list[Loop] = []
        self._writer_loop: Loop | None = None
        self._heartbeat: Heartbeat | None = None
        self._writer = self._new_writer()
        self._listener: Listener | None = None
        # Without NOTIFY, other processes' workers on this host are woken by a datagram.
        identity = _wake_identity(self.dialect, connector.url)
        self._wake_directory = None if identity is None else wake_directory(identity, table, queue)
        self._waker = Waker(self._wake_directory)
        self._wake_listener: WakeListener | None = None
        self._finished = threading.Condition()
        # PostgreSQL: the LISTEN for other processes' job ends, started by the first wait_finished()
        # and left once none has waited for ENDS_IDLE seconds; by this process (a fork's child starts its own).
        self._ends_loop: Loop | None = None
        self._ends_lock = threading.Lock()
        self._ends_waiters = 0
        self._ends_last_wait = time.monotonic()
        self._ends_pid = os.getpid()
        #: Called with (envelope, error) for a row that ran out of attempts by lease expiry.
        self.on_expired_dead: Callable[[ClaimedEnvelope, str], None] = lambda envelope, error: None
        #: Called with the id of a row this process holds that cancel() flagged (by the heartbeat, each beat).
        self.on_cancel_requested: Callable[[str, str | None], None] = lambda job_id, lease: None
        #: One job's record, cancel(), stats and dead letters, on this store's connections.
        self.admin = TableAdmin(self.connections, table=table, timeout=dispatch_timeout, on_requeue=self.wake_fetcher)
        self._progress = ProgressWriter(self, self._sql["PROGRESS"])

    def _dead_by_fetcher(self, envelope: ClaimedEnvelope, error: str) -> None:
        # Looked up at each call: the queue sets on_expired_dead after construction.
        self.on_expired_dead(envelope, error)

    def _hold(self, envelopes: Sequence[ClaimedEnvelope]) -> None:
        # Claimed rows are renewed until written back or given up; each open() has its own Leases.
        self._leases.hold(envelope.lease for envelope in envelopes)

    @property
    def keep_cancelled(self) -> float:
        """Seconds a cancelled job's row is kept for status() (the queue's keep_result)."""
        return self._fetcher.keep_cancelled

    @keep_cancelled.setter
    def keep_cancelled(self, value: float) -> None:
        self._fetcher.keep_cancelled = value

    @property
    def prefetch(self) -> int:
        """Rows claimed ahead of the workers that wait for them."""
        return self._fetcher.prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._fetcher.prefetch = value

    # -- connections --------------------------------------------------------

    def relax_this_thread(self) -> None:
        """The calling thread is one of this store's loops: it keeps its own connection, with relaxed commits."""
        self.connections.relax_this_thread()

    def _relax_if_marked(self) -> None:
        # A loop may also mark its thread by setting ``_local.relaxed``.
        if getattr(self._local, "relaxed", False):
            self.connections.relax_this_thread()

    def run(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        """Run ``operation(cursor)``, retrying through outages for up to ``deadline`` seconds (None: forever)."""
        self._relax_if_marked()
        return self.connections.run(operation, timeout=deadline)

    def transaction(
        self, operation: Callable[[Any], T], *, deadline: float | None = None, read_committed: bool = False
    ) -> T:
        """Like :meth:`run`, inside one transaction (BEGIN IMMEDIATE on SQLite); see ``Connections.transaction``."""
        self._relax_if_marked()
        return self.connections.transaction(operation, timeout=deadline, read_committed=read_committed)

    # -- intake ---------------------------------------------------------------

    def carry_also(self, var: contextvars.ContextVar[Any]) -> None:
        """Carry ``var`` with the jobs dispatched from now on, and set it around the runs of those that carry it."""
        self.carry[var.name] = var  # the dict the fetcher decodes rows with, too

    def carried(self, context: contextvars.Context) -> str | None:
        """The carried variables' values in ``context``, as JSON (None when none are set)."""
        if not self.carry:
            return None
        # list(): one step, so that a carry_also() from another thread cannot change it under the loop.
        values = {name: context[var] for name, var in list(self.carry.items()) if var in context}
        if not values:
            return None
        try:
            return json.dumps(values, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise QueueError(f"carried context variables must be JSON-serializable: {exc}") from exc

    def insert_params(self, envelope: Envelope, delay: float) -> tuple[Any, ...]:
        return (
            envelope.id,
            self.queue,
            envelope.name,
            envelope.payload,
            self.carried(envelope.context),
            envelope.max_attempts,
            envelope.priority,
            delay,
        )

    def put(self, envelope: Envelope, delay: float, unique: UniqueKey | None = None) -> str | None:
        return self.put_many([(envelope, delay)], keys=None if unique is None else [unique])[0]

    def put_many(
        self,
        items: Sequence[tuple[Envelope, float]],
        connection: Any = None,
        keys: Sequence[UniqueKey | None] | None = None,
    ) -> list[str | None]:
        """Insert rows in one transaction: the caller's (never committed here) or our own.

        ``keys``: each job's unique key, or None. Returns, for each job, None
        if it was inserted, else the id of the job that holds its key.
        """
        params = [self.insert_params(envelope, delay) for envelope, delay in items]
        subject = f"job {items[0][0].name!r}"
        holders: list[str | None]
        if keys is not None and any(key is not None for key in keys):
            holders = self._put_unique(items, params, keys, connection, subject)
            if all(holder is not None for holder in holders):
                return holders  # nothing inserted: nobody to wake
        else:
            holders = [None] * len(items)
            insert = self._intake.operation(items, params, own_transaction=len(items) == 1)
            if connection is not None:
                self._with_cursor(connection, insert)
            elif len(items) == 1:
                self.connections.run(insert, timeout=self.dispatch_timeout, subject=subject)
            else:
                self.connections.transaction(insert, timeout=self.dispatch_timeout, subject=subject)
        if connection is not None and self.dialect is not POSTGRES:
            # The caller commits later, and no driver says when: the fetcher
            # looks again soon. (PostgreSQL's NOTIFY comes with the commit.)
            self._fetcher.kick_soon()
        else:
            self._fetcher.kick()
        # Even before a caller's commit: a woken SQLite claim waits for the
        # caller's write lock, so it sees the rows once they are committed.
        self._waker.wake()
        return holders

    def _put_unique(
        self,
        items: Sequence[tuple[Envelope, float]],
        params: list[tuple[Any, ...]],
        keys: Sequence[UniqueKey | None],
        connection: Any,
        subject: str,
    ) -> list[str | None]:
        """Take the jobs' unique keys, then insert the jobs that took theirs, in one transaction (unique_keys.py)."""
        claims = [(envelope.id, key) for (envelope, _), key in zip(items, keys, strict=True)]
        own = connection is None
        plain = True

        def take_and_insert(cursor: Any) -> list[str | None]:
            nonlocal plain
            idempotent, plain = not plain, False
            try:
                if not own:
                    return self._take_and_insert(cursor, claims, items, params, idempotent=idempotent)
                # On MySQL its locking reads lock rows, never the gaps between them.
                return in_transaction(
                    cursor,
                    self.dialect,
                    lambda c: self._take_and_insert(c, claims, items, params, idempotent=idempotent),
                    read_committed=True,
                )
            except Exception as exc:
                # Refused by contention (a lock, a deadlock), a try wrote nothing: the next is plain
                # again. Else it may have committed (its reply lost): the next inserts what is absent.
                plain = self._is_contention(exc)
                raise

        if own:
            taken: list[str | None] = self.connections.run(
                take_and_insert, timeout=self.dispatch_timeout, subject=subject
            )
            return taken
        return self._with_cursor(connection, take_and_insert)

    def _take_and_insert(
        self,
        cursor: Any,
        claims: list[tuple[str, UniqueKey | None]],
        items: Sequence[tuple[Envelope, float]],
        params: list[tuple[Any, ...]],
        *,
        idempotent: bool,
    ) -> list[str | None]:
        taken = self._unique_keys.take_all(cursor, claims)
        fresh = [index for index, holder in enumerate(taken) if holder is None]
        if fresh:
            self._intake.insert(cursor, [items[i] for i in fresh], [params[i] for i in fresh], idempotent=idempotent)
        return taken

    @staticmethod
    def _with_cursor(connection: Any, operation: Callable[[Any], T]) -> T:
        """``operation(cursor)`` on a cursor of the caller's ``connection``, in its transaction."""
        cursor = connection.cursor()
        try:
            return operation(cursor)
        finally:
            cursor.close()

    def wake_fetcher(self) -> None:
        """Look for ready rows now (rows were queued some other way than put_many)."""
        self._fetcher.kick()

    @property
    def channel(self) -> str:
        return notify_channel(self.table, self.queue)

    @property
    def finished_channel(self) -> str:
        """PostgreSQL: the channel on which the ends of this queue's jobs are announced, for ``result()``."""
        return f"{self.channel}_end"

    # -- the worker loop's calls ------------------------------------------

    def claim(self, stopping: threading.Event) -> Envelope | None:
        return self._fetcher.take()

    def _settled(self, envelopes: list[ClaimedEnvelope]) -> None:
        # Their waiting jobs let go first: a queue that says it is drained has none waiting on these runs.
        ended = {envelope.limit for envelope in envelopes if envelope.limit is not None}
        if ended:
            self._let_go(ended)
        self._fetcher.settled(envelopes)
        self._announce_finish()

    def limit_with(self, limit_of: Callable[[Envelope], LimitKey | None], in_use: Callable[[], bool]) -> None:
        self._fetcher.limit_of = limit_of
        self._limits_in_use = in_use

    def _let_go(self, digests: Iterable[str]) -> None:
        """Runs of these limit keys ended: their next waiting jobs go (see ``permits.py``), and workers are woken."""
        for digest in sorted(digests):

            def let_go(cursor: Any, digest: str = digest) -> list[str]:
                ids = self._permits.let_go(cursor, digest)
                if ids and self.dialect is POSTGRES:  # sent at the commit
                    cursor.execute(self._sql["NOTIFY"], (self.channel, ids[0]))
                return ids

            try:
                ids = self.transaction(let_go, deadline=self.dispatch_timeout, read_committed=True)
            except Exception:
                logger.warning("letting go the jobs waiting on a limit failed; housekeeping will", exc_info=True)
                continue
            if ids:
                logger.debug("%d job(s) waiting on a limit of queue %r let go", len(ids), self.queue)
                self._fetcher.kick()
                self._waker.wake()

    def _tend_limits(self) -> None:
        """Housekeeping: forget ended permits and unused keys; let go what waits where permits are free."""
        permits = self._permits
        if not self._limits_in_use() and not self.run(permits.any_keys, deadline=self.dispatch_timeout):
            return  # no class declares a limit, and no key of this queue was left behind by one that did
        # Read committed on MySQL: its deletes lock the rows they delete, not the gaps a claim inserts into.
        self.transaction(permits.prune, deadline=self.dispatch_timeout, read_committed=True)
        for digest in self.run(permits.unused_keys, deadline=self.dispatch_timeout):
            forget = functools.partial(permits.forget_key, digest=digest)
            self.transaction(forget, deadline=self.dispatch_timeout, read_committed=True)
        self._let_go(self.run(permits.waiting_keys, deadline=self.dispatch_timeout))

    # Outcomes go through the outcome writer's thread: no worker (and no
    # shutdown) waits on the database for longer than a bound. Settled once
    # written (or given up): until then the row is this worker's, and
    # drained() must not say the queue is empty.

    def complete(self, envelope: Envelope, result: str | None, keep: float, progress: str | None = None) -> None:
        # Deleted in batches: one commit for many jobs. A crash before the
        # flush means the job runs again, as at-least-once allows.
        claimed = _claimed(envelope)
        claimed.result, claimed.keep, claimed.progress = result, keep, progress
        self._writer.complete(claimed)

    def cancelled(self, envelope: Envelope, progress: str | None) -> None:
        claimed = _claimed(envelope)
        self._fenced_end("CANCELLED", (claimed.attempt, progress, claimed.id, claimed.lease), claimed)

    def progress(self, envelope: Envelope, progress: Progress) -> None:
        claimed = _claimed(envelope)
        self._progress.put(claimed.id, claimed.lease, progress)

    def status(self, job_id: str) -> JobStatus | None:
        return self.admin.status(job_id)

    def cancel(self, job_id: str) -> str | None:
        found = self.admin.cancel(job_id)
        if found == "requested":
            # A row this process holds (one claimed ahead, maybe, that no
            # worker has begun): its run ends cancelled without waiting for
            # the heartbeat to read the request.
            holder = self.admin.holder(job_id)
            if holder is not None and holder[0] == self.owner:
                self.on_cancel_requested(job_id, holder[1])
        return found

    def park(self, envelope: Envelope, due: float) -> None:
        delay = max(0.0, due - self._clock())
        claimed = _claimed(envelope)
        self._fenced("PARK", (claimed.attempt, delay, claimed.id, claimed.lease), claimed)

    def release(self, envelope: Envelope) -> None:
        # Not waited for: shutdown hands runs back, and its grace is its own.
        claimed = _claimed(envelope)
        self._fenced("PARK", (claimed.attempt, 0.0, claimed.id, claimed.lease), claimed, wait=0.0)

    def dead(self, envelope: Envelope, error: str, traceback: str | None = None) -> None:
        # Waited for (within a bound): the dead-letter callbacks run after, and
        # pending_count() should already be down then.
        claimed = _claimed(envelope)
        self._fenced_end("DEAD", (claimed.attempt, error, traceback, claimed.id, claimed.lease), claimed)

    def wake(self, count: int) -> None:
        self._fetcher.wake(count)

    def _fenced(
        self, query: str, params: tuple[Any, ...], envelope: ClaimedEnvelope, wait: float | None = None
    ) -> None:
        writer = self._writer
        bound = writer.try_bound if wait is None else wait
        writer.write(envelope, self._sql[query], params, wait=bound)

    def _fenced_end(self, query: str, params: tuple[Any, ...], envelope: ClaimedEnvelope) -> None:
        """A job's end: on PostgreSQL with the NOTIFY that wakes ``result()`` in other processes."""
        if self.dialect is POSTGRES:
            self._fenced(f"{query}_NOTIFY", (*params, self.finished_channel), envelope)
        else:
            self._fenced(query, params, envelope)

    # -- counting and waiting ------------------------------------------------

    def pending(self) -> int:
        def count(cursor: Any) -> int:
            cursor.execute(self._sql["PENDING"], (self.queue,))
            return int(cursor.fetchone()[0])

        return self.run(count, deadline=self.dispatch_timeout)

    def drained(self) -> bool:
        """Nothing is ready to run on this queue and no worker here runs one of its jobs.

        Delayed jobs and retries waiting for their backoff do not count.
        """

        idle = self._fetcher.idle_mark

        def count(cursor: Any) -> int:
            cursor.execute(self._sql["READY"], (self.queue,))
            return int(cursor.fetchone()[0])

        before = idle()
        if before is None or self.run(count, deadline=self.dispatch_timeout):
            return False
        # A claim that began and committed while the count ran took the rows
        # it did not see: idle before and after, with no claim between.
        return idle() == before

    def wait_finished(self, timeout: float) -> None:
        """Wait up to ``timeout`` for one of this process's jobs to finish (on PostgreSQL, any process's)."""
        listening = self.dialect is POSTGRES and self._listen_for_ends()
        try:
            with self._finished:
                self._finished.wait(timeout)
        finally:
            if listening:
                with self._ends_lock:
                    self._ends_waiters -= 1
                    self._ends_last_wait = time.monotonic()

    def _listen_for_ends(self) -> bool:
        """Count a waiter, and start the thread that LISTENs for this queue's job ends if none runs; False: poll.

        Only while something waits (``result()``), in any process, a web app's
        that never starts workers too: the thread leaves once no one has
        waited for :data:`ENDS_IDLE` seconds, and at ``close()``.
        """
        with self._ends_lock:  # result() waits seconds between looks: the lock costs nothing there
            if self._ends_pid != os.getpid():  # a fork's child: the thread and its connection are the parent's
                self._ends_loop, self._ends_pid = None, os.getpid()
            if self._ends_loop is None:

                def idle() -> bool:
                    with self._ends_lock:
                        if self._ends_loop is not loop:
                            return True
                        if self._ends_waiters or time.monotonic() - self._ends_last_wait < ENDS_IDLE:
                            return False
                        self._ends_loop = None
                        return True

                listener = Listener(
                    self.connector.connect,
                    channel=self.finished_channel,
                    kick=self._announce_finish,
                    poll_interval=self.poll_interval,
                    until=idle,
                )
                loop = Loop("syncjobs-result-listener", listener.loop, listener.abort)
                try:
                    loop.start()
                except RuntimeError:  # the interpreter is exiting: the waiter polls
                    return False
                self._ends_loop = loop
            self._ends_waiters += 1
            return True

    def _stop_listening_for_ends(self, deadline: float) -> None:
        with self._ends_lock:
            ends, self._ends_loop = self._ends_loop, None
            ours = self._ends_pid == os.getpid()
        if ends is not None and ours:  # a fork's child must not break its parent's connection
            ends.stop()
            ends.join(deadline)

    def _announce_finish(self) -> None:
        with self._finished:
            self._finished.notify_all()

    def wait_empty(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.pending() == 0:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            # Woken early by this process's own outcomes; other processes'
            # are seen at the next look.
            with self._finished:
                self._finished.wait(min(0.05, remaining) if remaining is not None else 0.05)

    # -- lifecycle ----------------------------------------------------------------

    def open(self) -> None:
        self._leases = Leases()
        self._writer = writer = self._new_writer()
        self._heartbeat = heartbeat = Heartbeat(
            self,
            self._leases,
            renew=self._renew,
            also=self._worker_beat,
            down=self._worker_down if self.workers else None,
            lease=self.lease,
            owner=self.owner,
        )
        self._writer_loop = Loop("syncjobs-completer", self._relaxed(writer.loop), writer.wake)
        self._loops = [
            Loop(FETCHER_THREAD, self._relaxed(self._fetcher.loop), self._fetcher.stop),
            self._writer_loop,
            Loop("syncjobs-heartbeat", self._relaxed(heartbeat.loop)),
        ]
        if self.workers:
            self._loops.append(Loop("syncjobs-progress", self._relaxed(self._progress.loop), self._progress.wake))
        self._listener = None
        if self.dialect is POSTGRES:
            self._listener = Listener(
                self.connector.connect, channel=self.channel, kick=self._fetcher.kick, poll_interval=self.poll_interval
            )
            self._loops.append(Loop("syncjobs-listener", self._listener.loop))
        self._wake_listener = None
        if self.workers and self._wake_directory is not None:
            listener = WakeListener(self._wake_directory, self._fetcher.kick, pause=CLAIM_COALESCE)
            if listener.bind():
                self._wake_listener = listener
                self._loops.append(Loop("syncjobs-wakeup", listener.loop, listener.stop))
        for loop in self._loops:
            loop.start()
        if self.workers:
            try:
                self.transaction(self._worker_up, deadline=self.dispatch_timeout)
            except Exception:  # noqa: BLE001 - only stats read the row; the heartbeat writes it later
                logger.warning("could not list this worker in %s_workers; the heartbeat tries again", self.table)

    def _new_writer(self) -> OutcomeWriter:
        return OutcomeWriter(
            self,
            self._leases,
            complete=self._write_completed,
            lease=self.lease,
            settled=self._settled,
            # SQLite's one write lock: the fewer commits, the less often a dispatch meets one.
            # A server's commits overlap; there the wait only delays them.
            coalesce=WRITE_COALESCE if self.dialect is SQLITE else 0.0,
        )

    def _relaxed(self, body: Callable[[threading.Event], None]) -> Callable[[threading.Event], None]:
        def relaxed(stop: threading.Event) -> None:
            # Outcomes and renewals only: if the server crashes before these
            # commits reach disk, the jobs run again (at-least-once).
            self._local.relaxed = True
            body(stop)

        return relaxed

    def _worker_up(self, cursor: Any) -> None:
        cursor.execute(
            self._sql["WORKER_UP_MYSQL" if self.dialect is MYSQL else "WORKER_UP"],
            (self.owner, self.queue, socket.gethostname()[:255], os.getpid(), self.workers, self.lease),
        )

    def close(self, deadline: float | None = None) -> None:
        """Stop the loops and write what is left, until the monotonic ``deadline`` (5 s from now by default).

        What could not be written by then is left to its lease (and logged):
        a claimed row runs again once its lease expires.
        """
        if deadline is None:
            deadline = time.monotonic() + 5.0
        self._stop_listening_for_ends(deadline)
        writer = self._writer
        writer.flush_deadline = deadline
        if self._heartbeat is not None:
            self._heartbeat.leave_by = deadline
        for loop in self._loops:
            if loop is not self._writer_loop:
                loop.stop()
        # A claim in flight lands in the buffer before the buffer is emptied below.
        for loop in self._loops:
            if loop.thread.name == FETCHER_THREAD:
                loop.join(deadline)
        # Claimed for a worker that never took them: back to the queue, no run spent.
        for item in self._fetcher.unclaimed():
            writer.write(item, self._sql["PARK"], (item.attempt, 0.0, item.id, item.lease), wait=0.0, taken=False)
        for loop in self._loops:
            loop.stop()  # the writer last: it flushes what was queued above
        stuck = [loop for loop in self._loops if not loop.join(deadline)]
        if stuck:
            # Blocked in the database past the deadline (a silent network, a
            # lock held elsewhere): break their connections under them.
            logger.warning(
                "the %s database did not answer within the shutdown grace; leaving %s (what they had not "
                "written is left to its lease)",
                self.dialect.name,
                ", ".join(loop.thread.name for loop in stuck),
            )
            # Shut their sockets down under them (the connections' owner does
            # that for a connection in use), so they see an error and their stop.
            self.connections.close(retire=[loop.thread for loop in stuck])
            if self._listener is not None:
                self._listener.abort()
            bound = time.monotonic() + 0.5
            stuck = [loop for loop in stuck if not loop.join(bound)]
            if stuck:
                logger.debug("left behind: %s", ", ".join(loop.thread.name for loop in stuck))
        self._loops = []
        self._heartbeat = None
        if self._wake_listener is not None:
            self._wake_listener.close()  # its loop closes it; this covers a loop that never ran
            self._wake_listener = None
        self._waker.close()
        self.connections.close()

    # -- what the background loops run --------------------------------------------

    def _write_completed(self, batch: list[ClaimedEnvelope], deadline: float) -> int:
        """Delete finished rows (fenced on their leases), record and count them, in one commit; how many."""
        if self.dialect is POSTGRES:
            # One statement, so one round trip and no BEGIN/COMMIT: the completer is
            # the busiest writer of a queue that runs short jobs.
            ids = [envelope.id for envelope in batch]
            tokens = [envelope.lease for envelope in batch]
            results = [envelope.result for envelope in batch]
            keeps = [envelope.keep for envelope in batch]
            progress = [envelope.progress for envelope in batch]

            def complete(cursor: Any) -> int:
                params = (ids, tokens, results, keeps, progress, self.queue, int(time.time()), self.finished_channel)
                cursor.execute(self._sql["COMPLETE_RECORD_COUNT"], params)
                row = cursor.fetchone()
                return int(row[0]) if row else 0

            return self.run(complete, deadline=deadline)
        return self.transaction(lambda cursor: self._delete_completed(cursor, batch), deadline=deadline)

    def _delete_completed(self, cursor: Any, batch: list[ClaimedEnvelope]) -> int:
        """Delete finished rows (fenced on their leases) and count them done; how many were deleted."""
        by_lease: dict[str | None, list[ClaimedEnvelope]] = {}
        for envelope in batch:
            by_lease.setdefault(envelope.lease, []).append(envelope)
        deleted = 0
        for lease, envelopes in by_lease.items():
            ids = [envelope.id for envelope in envelopes]
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ", ".join([self.dialect.placeholder] * len(chunk))
                self._keep_results(cursor, lease, envelopes[start : start + 500])
                cursor.execute(self._sql["COMPLETE_MANY"].replace("{ids}", marks), (lease, *chunk))
                deleted += int(cursor.rowcount)
            # So that a dispatch retried after a lost reply does not insert them again.
            self._intake.record_finished(cursor, ids)
        if deleted:
            # Counted with the deletes they record, for "done in the last minute".
            count = self._sql["COUNT_DONE_MYSQL" if self.dialect is MYSQL else "COUNT_DONE"]
            cursor.execute(count, (self.queue, int(time.time()), deleted))
        return deleted

    def _keep_results(self, cursor: Any, lease: str | None, envelopes: list[ClaimedEnvelope]) -> None:
        """Record the done jobs that keep a result, from their rows (fenced on ``lease``), before they go."""
        group: list[ClaimedEnvelope] = []
        size = 0
        for envelope in envelopes:
            if envelope.keep <= 0:
                continue
            length = len(envelope.result or "") + len(envelope.progress or "")
            if group and (size + length > _KEEP_CHARS or len(group) >= _KEEP_ROWS):
                self._keep_group(cursor, lease, group)
                group, size = [], 0
            group.append(envelope)
            size += length
        if group:
            self._keep_group(cursor, lease, group)

    def _keep_group(self, cursor: Any, lease: str | None, kept: list[ClaimedEnvelope]) -> None:
        mark = self.dialect.placeholder
        case = "CASE id" + f" WHEN {mark} THEN {mark}" * len(kept) + " END"
        sql = self._sql["KEEP_RESULTS"].replace("{results}", case).replace("{progress}", case)
        sql = sql.replace("{keeps}", case).replace("{ids}", ", ".join([mark] * len(kept)))
        params: list[Any] = []
        for field in ("result", "progress", "keep"):
            for envelope in kept:
                params += (envelope.id, getattr(envelope, field))
        cursor.execute(sql, (*params, lease, *(envelope.id for envelope in kept)))

    def _renew(self, cursor: Any, tokens: list[str]) -> None:
        """Push back the leases of the rows this process holds, and only those."""
        for start in range(0, len(tokens), 500):
            chunk = tokens[start : start + 500]
            marks = ", ".join([self.dialect.placeholder] * len(chunk))
            cursor.execute(self._sql["RENEW"].replace("{tokens}", marks), (self.lease, self.owner, *chunk))

    def _worker_down(self, cursor: Any) -> None:
        cursor.execute(self._sql["WORKER_DOWN"], (self.owner,))

    def _worker_beat(self, cursor: Any) -> None:
        if self.workers:
            cursor.execute(self._sql["WORKER_BEAT"], (self.owner,))
            if not cursor.rowcount:  # pruned while this process stalled: list it again
                self._worker_up(cursor)
            # What cancel() asked of the rows this process holds, from any process.
            cursor.execute(self._sql["CANCEL_REQUESTS"], (self.owner,))
            for job_id, lease in cursor.fetchall():
                self.on_cancel_requested(str(job_id), lease)


#: One statement keeps at most this many results (7 parameters each: within
#: SQLite's oldest limit of 999) and this many characters of them (within
#: MySQL's default max_allowed_packet of 16 MB, whatever the encoding).
_KEEP_ROWS = 100
_KEEP_CHARS = 3_000_000


def _claimed(envelope: Envelope) -> ClaimedEnvelope:
    """The worker loop hands back what :meth:`DatabaseStore.claim` gave it: a claimed envelope."""
    return cast(ClaimedEnvelope, envelope)


def _wake_identity(dialect: Dialect, url: str) -> str | None:
    """The database as every process on this host names it, for wake-ups; None with NOTIFY (PostgreSQL)."""
    if dialect is SQLITE:
        return os.path.realpath(database_file(url))
    if dialect is MYSQL:
        parts = urlsplit(url)
        return f"mysql://{parts.hostname}:{parts.port or 3306}{parts.path}"
    return None
