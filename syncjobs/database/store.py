"""The database store: jobs as rows, claimed in batches under leases.

One fetcher thread claims rows for the workers that are waiting (up to one
per idle worker, in one transaction), a heartbeat thread renews the leases of
this process's running rows, and on PostgreSQL a listener thread wakes the
fetcher on NOTIFY. Workers take claimed envelopes from a local queue, so the
worker loop is the in-memory one, unchanged.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import os
import queue as stdqueue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import tenacity

from ..envelope import Envelope
from ..errors import QueueError
from . import queries
from .dialects import MYSQL, POSTGRES, Connector

logger = logging.getLogger("syncjobs.database")

T = TypeVar("T")


class DatabaseUnavailable(QueueError):
    """The database could not be reached in time; nothing was enqueued."""


class _Wake:
    """Put on the local queue to wake one blocked worker."""


_WAKE = _Wake()


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
        #: Rows claimed ahead of the workers that wait for them.
        self.prefetch = prefetch
        #: Worker threads this store feeds; a store with any is listed in ``<table>_workers``.
        self.workers = workers
        self._clock = clock
        # Unique per process start (and per store): leases name their owner.
        self.owner = f"{uuid.uuid4().hex[:12]}"
        self._sql = {name: self.dialect.sql(text, table) for name, text in vars(queries).items() if name.isupper()}
        self._local = threading.local()
        self._insert_cache: dict[int, str] = {}
        self._connections: list[Any] = []
        self._connections_lock = threading.Lock()
        self._ready: stdqueue.SimpleQueue[Envelope | _Wake] = stdqueue.SimpleQueue()
        # Workers waiting in claim() and envelopes buffered for them: the
        # fetcher claims the difference, so it never hoards rows.
        self._want = threading.Condition()
        self._waiting = 0
        self._buffered = 0
        # Envelopes handed to a worker and not yet finished or given back,
        # and claims between their commit and the local queue.
        self._inflight = 0
        self._claiming = 0
        self._claims_begun = 0
        self._kick = threading.Event()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._finished = threading.Condition()
        self._completions: list[Envelope] = []
        self._completions_cond = threading.Condition()
        #: Called with (envelope, error) for a row that ran out of attempts by lease expiry.
        self.on_expired_dead: Callable[[Envelope, str], None] = lambda envelope, error: None

    # -- connections --------------------------------------------------------

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.connector.connect()
            if getattr(self._local, "relaxed", False) and self.dialect is POSTGRES:
                # Claims and completions only: if the server crashes before
                # these commits reach disk, the jobs run again (at-least-once),
                # and commits stop waiting for fsync. Dispatch stays durable.
                conn.execute("SET synchronous_commit TO off")
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._connections_lock:
                if conn in self._connections:
                    self._connections.remove(conn)
            try:
                conn.close()
            except Exception:
                logger.debug("closing a broken connection failed", exc_info=True)

    def _retrying(self, deadline: float | None) -> tenacity.Retrying:
        """Reconnect and retry on a lost connection or a locked SQLite, with capped, jittered waits."""
        stop: Any = tenacity.stop_never if deadline is None else tenacity.stop_after_delay(deadline)
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(self.connector.is_transient),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=2.0),
            stop=stop,
            before_sleep=self._before_retry,
            reraise=True,
        )

    def _before_retry(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None and self.connector.is_connection_error(exc):
            logger.warning("the %s database did not answer (%s); reconnecting", self.dialect.name, exc)
            self._drop_connection()
        else:
            # Contention (a deadlock, a lock wait, SQLite busy) is normal under load.
            logger.debug("the %s database was busy (%s); trying again", self.dialect.name, exc)

    def run(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        """Run ``operation(cursor)`` on this thread's connection, retrying through outages."""
        for attempt in self._retrying(deadline):
            with attempt:
                conn = self._connection()
                cursor = conn.cursor()
                try:
                    return operation(cursor)
                finally:
                    cursor.close()
        raise AssertionError("unreachable: tenacity re-raises")  # pragma: no cover

    def transaction(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        """Like :meth:`run`, inside one transaction (BEGIN IMMEDIATE on SQLite)."""

        def in_transaction(cursor: Any) -> T:
            cursor.execute(self.dialect.begin)
            try:
                result = operation(cursor)
            except BaseException:
                try:
                    cursor.execute("ROLLBACK")
                except Exception:
                    logger.debug("rollback failed", exc_info=True)
                raise
            cursor.execute("COMMIT")
            return result

        return self.run(in_transaction, deadline=deadline)

    # -- intake ---------------------------------------------------------------

    def carried(self, context: contextvars.Context) -> str | None:
        """The carried variables' values in ``context``, as JSON (None when none are set)."""
        if not self.carry:
            return None
        values = {name: context[var] for name, var in self.carry.items() if var in context}
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
            delay,
        )

    def put(self, envelope: Envelope, delay: float) -> None:
        self.put_many([(envelope, delay)])

    def put_many(self, items: Sequence[tuple[Envelope, float]], connection: Any = None) -> None:
        """Insert rows in one transaction: the caller's (never committed here) or our own."""
        params = [self.insert_params(envelope, delay) for envelope, delay in items]

        def insert(cursor: Any) -> None:
            # Multi-row VALUES, built of placeholders only: one round trip per
            # 500 rows on every driver (PyMySQL's executemany would not batch
            # an INSERT that has SQL expressions in it).
            for start in range(0, len(params), 500):
                chunk = params[start : start + 500]
                values = [value for row in chunk for value in row]
                if self.dialect is POSTGRES:
                    values.append(self.channel)
                cursor.execute(self._insert_sql(len(chunk)), values)

        if connection is not None:
            cursor = connection.cursor()
            try:
                insert(cursor)
            finally:
                cursor.close()
        else:
            try:
                if len(items) == 1:
                    self.run(insert, deadline=self.dispatch_timeout)
                else:
                    self.transaction(insert, deadline=self.dispatch_timeout)
            except Exception as exc:
                if self.connector.is_connection_error(exc):
                    raise DatabaseUnavailable(
                        f"job {items[0][0].name!r}: the {self.dialect.name} database is unavailable: {exc}"
                    ) from exc
                raise
        self._kick.set()

    def _insert_sql(self, rows: int) -> str:
        sql = self._insert_cache.get(rows)
        if sql is None:
            values = ", ".join([self._sql["INSERT_ROW"]] * rows)
            sql = f"{self._sql['INSERT_INTO']} {values}"
            if self.dialect is POSTGRES:
                # The same statement wakes the other processes' workers: the
                # NOTIFY is delivered at commit, so a rolled-back dispatch wakes
                # nobody, and it carries a job id, nothing from the job itself.
                sql = self._sql["INSERT_AND_NOTIFY"].replace("{insert}", sql)
            self._insert_cache[rows] = sql
        return sql

    @property
    def channel(self) -> str:
        # An identifier for LISTEN: the queue name is hashed, so that nothing
        # a caller chose reaches SQL text.
        return f"{self.table}_{hashlib.sha256(self.queue.encode()).hexdigest()[:16]}"

    # -- the worker loop's calls ------------------------------------------

    def claim(self, stopping: threading.Event) -> Envelope | None:
        with self._want:
            self._waiting += 1
            self._want.notify_all()
        item = self._ready.get()
        with self._want:
            self._waiting -= 1
            if item is not _WAKE:
                self._buffered -= 1
                self._inflight += 1
        return None if isinstance(item, _Wake) else item

    def _settled(self) -> None:
        with self._want:
            self._inflight -= 1

    def complete(self, envelope: Envelope) -> None:
        self._settled()
        # Deleted in batches by the completer thread: one commit for many jobs.
        # A crash before the flush means the job runs again, as at-least-once allows.
        with self._completions_cond:
            self._completions.append(envelope)
            self._completions_cond.notify()

    # Settled after the write: until the row is back (or dead), it is this
    # worker's, and drained() must not say the queue is empty.

    def park(self, envelope: Envelope, due: float) -> None:
        delay = max(0.0, due - self._clock())
        self._fenced("PARK", (envelope.attempt, delay, envelope.id, envelope.lease), envelope)
        self._settled()

    def release(self, envelope: Envelope) -> None:
        self._fenced("PARK", (envelope.attempt, 0.0, envelope.id, envelope.lease), envelope)
        self._settled()

    def dead(self, envelope: Envelope, error: str) -> None:
        self._fenced("DEAD", (envelope.attempt, error, envelope.id, envelope.lease), envelope)
        self._settled()

    def wake(self, count: int) -> None:
        for _ in range(count):
            self._ready.put(_WAKE)

    def _fenced(self, query: str, params: tuple[Any, ...], envelope: Envelope, deadline: float | None = None) -> None:
        def execute(cursor: Any) -> int:
            cursor.execute(self._sql[query], params)
            return int(cursor.rowcount)

        extra = {"job_name": envelope.name, "job_id": envelope.id}
        try:
            # Retried through an outage for as long as the lease lasts; past
            # it the row may be another worker's, so there is no point.
            changed = self.run(execute, deadline=self.lease if deadline is None else deadline)
        except Exception:
            logger.exception(
                "job %s (%s): its outcome could not be written; the lease will expire and the job run again",
                envelope.name,
                envelope.id,
                extra=extra,
            )
            return
        if changed == 0:
            logger.warning(
                "job %s (%s): its lease was lost (it ran too long or this worker stalled); "
                "the row belongs to another worker now and is left to it",
                envelope.name,
                envelope.id,
                extra=extra,
            )
        with self._finished:
            self._finished.notify_all()

    # -- counting and waiting ------------------------------------------------

    def pending(self) -> int:
        def count(cursor: Any) -> int:
            cursor.execute(self._sql["PENDING"], (self.queue,))
            return int(cursor.fetchone()[0])

        try:
            return self.run(count, deadline=self.dispatch_timeout)
        except Exception as exc:
            if self.connector.is_connection_error(exc):
                raise DatabaseUnavailable(f"the {self.dialect.name} database is unavailable: {exc}") from exc
            raise

    def drained(self) -> bool:
        """Nothing is ready to run on this queue and no worker here runs one of its jobs.

        Delayed jobs and retries waiting for their backoff do not count.
        """

        def idle() -> int | None:
            with self._want:
                busy = self._inflight or self._buffered or self._claiming
                return None if busy else self._claims_begun

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
        """Wait up to ``timeout`` for one of this process's jobs to finish."""
        with self._finished:
            self._finished.wait(timeout)

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
        # A new Event, not clear(): a listener of the last open() that has not
        # yet woken must still see its own store closed.
        self._closed = threading.Event()
        self._threads = [
            threading.Thread(target=self._fetch_loop, name="syncjobs-fetcher", daemon=True),
            threading.Thread(target=self._complete_loop, name="syncjobs-completer", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="syncjobs-heartbeat", daemon=True),
        ]
        if self.dialect is POSTGRES:
            self._threads.append(
                threading.Thread(target=self._listen_loop, args=(self._closed,), name="syncjobs-listener", daemon=True)
            )
        for thread in self._threads:
            thread.start()
        if self.workers:
            try:
                self.transaction(self._worker_up, deadline=self.dispatch_timeout)
            except Exception:  # noqa: BLE001 - only stats read the row; the heartbeat writes it later
                logger.warning("could not list this worker in %s_workers; the heartbeat tries again", self.table)

    def _worker_up(self, cursor: Any) -> None:
        cursor.execute(self._sql["WORKER_DOWN"], (self.owner,))
        cursor.execute(
            self._sql["WORKER_UP"],
            (self.owner, self.queue, socket.gethostname()[:255], os.getpid(), self.workers, self.lease),
        )

    def close(self) -> None:
        self._closed.set()
        self._kick.set()
        with self._want:
            self._want.notify_all()
        with self._completions_cond:
            self._completions_cond.notify_all()
        for thread in self._threads:
            # The listener leaves within poll_interval on its own (it is a
            # daemon, blocked in the driver); shutdown does not wait for it.
            # One that never started (open() failed before it) has nothing to join.
            if thread.name != "syncjobs-listener" and thread.ident is not None:
                thread.join(timeout=10.0)
        self._threads = []
        # Claimed for a worker that never took them: back to the queue, no run spent.
        while True:
            try:
                item = self._ready.get_nowait()
            except stdqueue.Empty:
                break
            if isinstance(item, Envelope):
                self._fenced("PARK", (item.attempt, 0.0, item.id, item.lease), item, deadline=5.0)
        with self._want:
            self._buffered = 0
        if self.workers:
            try:
                self.run(lambda cursor: cursor.execute(self._sql["WORKER_DOWN"], (self.owner,)), deadline=5.0)
            except Exception:  # the row lapses with its heartbeat anyway
                logger.debug("could not remove this worker from %s_workers", self.table, exc_info=True)
        self._close_connections()

    def _close_connections(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            try:
                conn.close()
            except Exception:
                logger.debug("closing a connection failed", exc_info=True)
        self._local = threading.local()

    # -- the completer ------------------------------------------------------------

    def _complete_loop(self) -> None:
        self._local.relaxed = True
        while True:
            with self._completions_cond:
                while not self._completions and not self._closed.is_set():
                    self._completions_cond.wait()
                batch, self._completions = self._completions, []
            if batch:
                self._delete_completed(batch)
            elif self._closed.is_set():
                return

    def _delete_completed(self, batch: list[Envelope]) -> None:
        by_lease: dict[str | None, list[str]] = {}
        for envelope in batch:
            by_lease.setdefault(envelope.lease, []).append(envelope.id)

        def delete(cursor: Any) -> int:
            deleted = 0
            for lease, ids in by_lease.items():
                for start in range(0, len(ids), 500):
                    chunk = ids[start : start + 500]
                    marks = ", ".join([self.dialect.placeholder] * len(chunk))
                    cursor.execute(self._sql["COMPLETE_MANY"].replace("{ids}", marks), (lease, *chunk))
                    deleted += int(cursor.rowcount)
            if deleted:
                # Counted with the deletes they record, for "done in the last minute".
                count = self._sql["COUNT_DONE_MYSQL" if self.dialect is MYSQL else "COUNT_DONE"]
                cursor.execute(count, (self.queue, int(time.time()), deleted))
            return deleted

        try:
            deleted = self.transaction(delete, deadline=self.lease)
        except Exception:
            logger.exception(
                "%d finished job(s) could not be deleted; their leases will expire and they run again", len(batch)
            )
            deleted = len(batch)
        if deleted < len(batch):
            logger.warning(
                "%d of %d finished job(s) had lost their lease (they ran too long or this worker stalled); "
                "their rows belong to another worker now and are left to it",
                len(batch) - deleted,
                len(batch),
            )
        with self._finished:
            self._finished.notify_all()

    # -- the fetcher ------------------------------------------------------------

    def _fetch_loop(self) -> None:
        self._local.relaxed = True
        next_recovery = 0.0
        recovery_interval = min(self.lease / 2, 5.0)
        while not self._closed.is_set():
            with self._want:
                # Also wake for lease recovery: the rows of a dead worker must
                # come back even while every worker here is busy.
                while (
                    not self._closed.is_set()
                    and self._waiting + self.prefetch - self._buffered <= 0
                    and time.monotonic() < next_recovery
                ):
                    self._want.wait(max(0.0, next_recovery - time.monotonic()))
                want = self._waiting + self.prefetch - self._buffered
            if self._closed.is_set():
                return
            try:
                if time.monotonic() >= next_recovery:
                    self._recover_expired()
                    next_recovery = time.monotonic() + recovery_interval
                if want <= 0:
                    continue
                with self._want:
                    self._claiming += 1
                    self._claims_begun += 1
                try:
                    claimed = self._claim_batch(want)
                except BaseException:
                    with self._want:
                        self._claiming -= 1
                    raise
            except Exception:
                logger.exception("claiming jobs from the %s database failed; trying again", self.dialect.name)
                self._closed.wait(self.poll_interval)
                continue
            with self._want:
                self._claiming -= 1
                self._buffered += len(claimed)
            if claimed:
                for envelope in claimed:
                    self._ready.put(envelope)
                continue
            self._kick.wait(self._idle_wait())
            self._kick.clear()

    def _idle_wait(self) -> float:
        """Until the next parked row is due, at most ``poll_interval``."""

        def next_due(cursor: Any) -> float | None:
            cursor.execute(self._sql["NEXT_DUE"], (self.queue,))
            row = cursor.fetchone()
            return None if row is None or row[0] is None else float(row[0])

        try:
            due = self.run(next_due, deadline=self.poll_interval)
        except Exception:  # noqa: BLE001 - only a hint; the poll interval bounds the wait anyway
            return self.poll_interval
        return self.poll_interval if due is None else max(0.0, min(due, self.poll_interval))

    def _claim_batch(self, want: int) -> list[Envelope]:
        token = str(uuid.uuid4())

        def claim(cursor: Any) -> list[tuple[Any, ...]]:
            cursor.execute(self._sql["SELECT_READY"], (self.queue, want))
            rows = list(cursor.fetchall())
            if rows:
                marks = ", ".join([self.dialect.placeholder] * len(rows))
                cursor.execute(
                    self._sql["MARK_CLAIMED"].replace("{ids}", marks),
                    (self.owner, token, self.lease, *(row[0] for row in rows)),
                )
            return rows

        def claim_returning(cursor: Any) -> list[tuple[Any, ...]]:
            cursor.execute(self._sql["CLAIM_RETURNING"], (self.owner, token, self.lease, self.queue, want))
            return list(cursor.fetchall())

        rows = self.run(claim_returning) if self.dialect.returning else self.transaction(claim)
        return [self._envelope(row, token) for row in rows]

    def _envelope(self, row: Sequence[Any], token: str | None) -> Envelope:
        job_id, name, payload, context, attempt, max_attempts = row
        return Envelope(
            str(job_id),
            str(name),
            str(payload),
            int(max_attempts),
            int(attempt),
            self._context(context, str(job_id)),
            lease=token,
        )

    def _context(self, carried: str | None, job_id: str) -> contextvars.Context:
        context = contextvars.Context()
        if not carried:
            return context
        try:
            values = json.loads(carried)
        except ValueError:
            logger.warning("job %s: its carried context is not JSON; running with the defaults", job_id)
            return context
        for name, value in values.items() if isinstance(values, dict) else ():
            var = self.carry.get(name)
            if var is not None:
                context.run(var.set, value)
        return context

    def _recover_expired(self) -> None:
        """Rows whose worker died: back to the queue with that run spent, or dead if it was the last."""

        def housekeeping(cursor: Any) -> None:
            # For stats: dead workers' rows, and done counts older than an hour.
            # Autocommitted, each on its own, so that they hold no lock across others.
            cursor.execute(self._sql["WORKERS_PRUNE"])
            cursor.execute(self._sql["DONE_PRUNE"], (self.queue, int(time.time()) - 3600))

        def recover(cursor: Any) -> list[tuple[Envelope, str | None]]:
            cursor.execute(self._sql["SELECT_EXPIRED"], (self.queue, 100))
            outcomes: list[tuple[Envelope, str | None]] = []
            for row in cursor.fetchall():
                envelope = self._envelope(row, None)
                envelope.attempt += 1
                if envelope.attempt >= envelope.max_attempts:
                    error = (
                        f"lease expired on its last attempt ({envelope.attempt} of {envelope.max_attempts}): "
                        "its worker died or stalled"
                    )
                    cursor.execute(self._sql["DEAD_EXPIRED"], (envelope.attempt, error, envelope.id))
                    outcomes.append((envelope, error))
                else:
                    cursor.execute(self._sql["REQUEUE_EXPIRED"], (envelope.attempt, envelope.id))
                    outcomes.append((envelope, None))
            return outcomes

        self.run(housekeeping)
        for envelope, error in self.transaction(recover):
            if error is None:
                logger.warning(
                    "job %s (%s): lease expired, claimed again (run %d of %d spent)",
                    envelope.name,
                    envelope.id,
                    envelope.attempt,
                    envelope.max_attempts,
                    extra={"job_name": envelope.name, "job_id": envelope.id},
                )
            else:
                self.on_expired_dead(envelope, error)

    # -- heartbeat and notifications ------------------------------------------

    def _heartbeat_loop(self) -> None:
        # Relaxed like the claims: a renewal lost in a server crash costs nothing.
        self._local.relaxed = True
        interval = self.lease / 3

        def renew(cursor: Any) -> None:
            cursor.execute(self._sql["RENEW"], (self.lease, self.owner))
            if self.workers:
                cursor.execute(self._sql["WORKER_BEAT"], (self.owner,))
                if not cursor.rowcount:  # pruned while this process stalled: list it again
                    self._worker_up(cursor)

        while not self._closed.wait(interval):
            try:
                self.run(renew, deadline=interval)
            except Exception:
                logger.exception("renewing the leases of worker %s failed; trying again", self.owner)

    def _listen_loop(self, closed: threading.Event) -> None:
        """PostgreSQL: LISTEN on the queue's channel and kick the fetcher on each NOTIFY."""
        while not closed.is_set():
            try:
                conn = self.connector.connect()
            except Exception:
                logger.debug("the notification connection could not be opened", exc_info=True)
                closed.wait(self.poll_interval)
                continue
            try:
                conn.execute(f'LISTEN "{self.channel}"')
                while not closed.is_set():
                    for _ in conn.notifies(timeout=self.poll_interval, stop_after=1):
                        self._kick.set()
            except Exception:
                logger.info("the notification connection dropped; re-opening it", exc_info=True)
                closed.wait(min(self.poll_interval, 1.0))
            finally:
                try:
                    conn.close()
                except Exception:
                    logger.debug("closing the notification connection failed", exc_info=True)
