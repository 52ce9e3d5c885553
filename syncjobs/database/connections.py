"""One process's connections to one database, and the deadline every operation on them keeps.

- **Per process.** Connections belong to the process that opened them: a
  forked child (gunicorn ``--preload``, multiprocessing) opens its own and
  never uses, nor closes, its parent's (closing would end the parent's
  session on the server).
- **Bounded in number.** A thread that marks itself with
  :meth:`Connections.relax_this_thread` (the store's own loops: few, and
  long-lived) keeps one connection. Every other thread (workers writing an
  outcome, request threads that dispatch) borrows one of at most
  ``pool_size`` for each operation, so a server with many short-lived
  threads never grows the number of sessions.
- **Bounded in time.** An operation given a timeout returns or raises within
  it: a connect that outlives it is left to finish (and close) on its own, a
  statement that outlives it has its connection's socket shut down, so that a
  silently dead network path (no RST, nothing ever answers) cannot block the
  caller past its timeout. Without a timeout, each attempt is still cut off
  after :data:`~.dialect.STATEMENT_TIMEOUT` plus a margin and tried again on a
  new connection.
- **Retried.** A lost connection or contention (a deadlock, a lock wait,
  SQLite busy) is tried again, with capped, jittered waits, until the timeout.
- **One error.** What is still failing for one of those reasons when the
  timeout passes is :class:`DatabaseUnavailable`, raised here and nowhere else.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import tenacity

from ..errors import QueueError
from .dialect import STATEMENT_TIMEOUT, Dialect
from .dialects import Connector

logger = logging.getLogger("syncjobs.database")

T = TypeVar("T")

#: Connections that threads other than the store's own loops share, per process.
DEFAULT_POOL_SIZE = 4

#: How long one attempt may take when its caller gave no shorter timeout: past
#: the server's own statement timeout, so that the server's error comes first
#: when the network is fine.
ATTEMPT_TIMEOUT = STATEMENT_TIMEOUT + 5.0
#: The first and the longest wait between tries of an operation that met
#: contention: a lock, where connections do not wait for locks themselves
#: (SQLite: a dispatch takes about 0.1 ms, and a worker holds the write lock
#: for a few tenths; a lock held far longer is tried about 200 times a
#: second), or a deadlock or serialization failure on a server.
LOCK_STEPS = (0.00002, 0.01)
#: How often the watchdog looks while operations come and go; after this
#: many looks with none in flight it waits to be notified.
WATCHDOG_TICK = 0.5
WATCHDOG_IDLE_TICKS = 4


class DatabaseUnavailable(QueueError):
    """The database could not be reached in time; nothing was enqueued."""


class _Unreachable(Exception):
    """No connection, or no answer on one, within the operation's timeout."""


class _OutOfTime(_Unreachable):
    """The timeout ran out between tries: the error worth reporting is the previous try's."""


class _Connection:
    """A driver connection, what can abort it from another thread, and who uses it now."""

    def __init__(self, raw: Any, abort: Callable[[], None], close: Callable[[], None]) -> None:
        self.raw = raw
        self._abort = abort
        self._close = close
        self.busy = False
        #: Set by close() for a connection busy at the time: its user closes it when done.
        self.doomed = False
        #: Set when the watchdog aborted it: its error means "timed out", not a server's refusal.
        self.aborted = False
        #: One thread's own (a loop's), not the pool's.
        self.dedicated = False

    def abort(self) -> None:
        self.aborted = True
        try:
            self._abort()
        except Exception:
            logger.debug("aborting a connection failed", exc_info=True)

    def close(self) -> None:
        try:
            self._close()
        except Exception:
            logger.debug("closing a connection failed", exc_info=True)


class _Watchdog:
    """Aborts the connection of an operation that outlives its end time.

    One thread per process and Connections, started on first use; arming and
    disarming cost a lock and a heap push, no system call.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Connection]] = []
        self._armed: set[int] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        #: When the thread looks next (inf: when notified). Only an end time
        #: before it wakes the thread: waking it for every operation would
        #: hand the GIL to it and back once per query.
        self._wake_at = math.inf
        #: The running thread's own stop flag. A thread started after a stop()
        #: gets a new one: it never clears the flag of a thread stop() joins.
        self._stopped: threading.Event | None = None

    def arm(self, conn: _Connection, endtime: float) -> int:
        """Abort ``conn`` at ``endtime`` unless disarmed first; the token for :meth:`disarm`."""
        with self._cond:
            token = next(self._seq)
            heapq.heappush(self._heap, (endtime, token, conn))
            self._armed.add(token)
            if endtime < self._wake_at:
                self._ensure_thread()
                self._cond.notify()
        return token

    def disarm(self, token: int) -> None:
        # Under the lock: once disarmed, the watchdog never touches this
        # connection again, so its user may close it.
        with self._cond:
            self._armed.discard(token)
            # Operations mostly end in the order they began: the one ending is
            # usually the heap's first. Dropped now, not when its end time
            # comes, or the heap would hold every operation of the last
            # ATTEMPT_TIMEOUT seconds (megabytes on a busy worker).
            heap = self._heap
            while heap and heap[0][1] not in self._armed:
                heapq.heappop(heap)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        stopped = threading.Event()
        thread = threading.Thread(target=self._loop, args=(stopped,), name="syncjobs-watchdog", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # the interpreter is exiting: the drivers' own timeouts still apply
            logger.debug("the connection watchdog could not start", exc_info=True)
            return
        self._thread, self._stopped = thread, stopped

    def _loop(self, stopped: threading.Event) -> None:
        empty_looks = 0
        with self._cond:
            while not stopped.is_set():
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    # Operations end within microseconds, usually before this
                    # thread looks: while they come, look every tick rather
                    # than be notified (and take the GIL) for each one.
                    empty_looks += 1
                    tick = WATCHDOG_TICK if empty_looks <= WATCHDOG_IDLE_TICKS else math.inf
                    self._wake_at = time.monotonic() + tick
                    self._cond.wait(None if tick == math.inf else tick)
                    continue
                empty_looks = 0
                endtime, token, conn = self._heap[0]
                remaining = endtime - time.monotonic()
                if remaining > 0:
                    self._wake_at = endtime
                    self._cond.wait(remaining)
                    continue
                heapq.heappop(self._heap)
                self._armed.discard(token)
                logger.debug("an operation on the database outlived its timeout; aborting its connection")
                conn.abort()

    def stop(self) -> None:
        with self._cond:
            if self._stopped is not None:
                self._stopped.set()
            self._cond.notify_all()
            thread, self._thread, self._stopped = self._thread, None, None
            self._wake_at = math.inf  # the next thread is notified by the next arm()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)


class _PendingConnect:
    """A connect running in a helper thread, which the caller may stop waiting for."""

    def __init__(self, connect: Callable[[], _Connection]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._abandoned = False
        self.conn: _Connection | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
            self.error = exc
            self._done.set()
            return
        with self._lock:
            if not self._abandoned:
                self.conn = conn
                self._done.set()
                return
        conn.close()  # the caller gave up on it: no session is left behind

    def wait(self, timeout: float) -> _Connection:
        self._done.wait(timeout)
        with self._lock:
            if self.conn is None and self.error is None:
                self._abandoned = True
                raise _Unreachable(f"no connection within {timeout:.1f}s")
        if self.conn is None:
            raise self.error or _Unreachable("the connect ended without a connection")
        return self.conn


class _ProcessState:
    """Everything about connections that belongs to one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Condition()
        self.local = threading.local()
        #: Every connection open now: the idle and busy of the pool, and the loops' own.
        self.open: set[_Connection] = set()
        self.idle: list[_Connection] = []
        self.pooled = 0
        self.watchdog = _Watchdog()


class Connections:
    """The connections of one store (or admin) to one database URL, in this process."""

    def __init__(self, connector: Connector, *, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        self.connector = connector
        self.dialect = connector.dialect
        self.pool_size = pool_size
        self._state = _ProcessState()
        # A child's copies of its parent's connections: kept, untouched, so
        # that neither we nor the garbage collector ever closes them here.
        self._parents: list[_ProcessState] = []
        # Threads a close() gave up waiting for: they may not connect again.
        self._retired: set[threading.Thread] = set()

    # -- the calls ---------------------------------------------------------------

    def relax_this_thread(self) -> None:
        """This thread is one of the store's loops: it keeps a connection, with relaxed commits.

        Its commits (claims, completions, renewals) stop waiting for the
        server's disk where the database allows: a server crash may undo the
        last of them, and those jobs run again, as at-least-once allows.
        """
        self._current().local.relaxed = True

    def run(self, operation: Callable[[Any], T], *, timeout: float | None = None, subject: str | None = None) -> T:
        """``operation(cursor)`` on a connection of this thread's, retried through outages.

        With ``timeout``, returns or raises within it; :class:`DatabaseUnavailable`
        (naming ``subject``, if given) when the database could not be reached
        or stayed locked for all of it.
        """
        endtime = None if timeout is None else time.monotonic() + timeout
        try:
            # The first try outside tenacity: most operations succeed at once,
            # and a retry loop costs as much as the rest of a call.
            return self._attempt_past_locks(operation, endtime)
        except Exception as exc:
            if not self._is_transient(exc):
                raise
            first: Exception | None = exc
        previous = None if isinstance(first, _OutOfTime) else first
        try:
            remaining = None if endtime is None else endtime - time.monotonic()
            for attempt in self._retrying(remaining):
                with attempt:
                    if first is not None:  # tenacity's first attempt is that failed try: logged, then paused for
                        failed, first = first, None
                        raise failed
                    try:
                        return self._attempt_past_locks(operation, endtime)
                    except Exception as exc:
                        if not isinstance(exc, _OutOfTime):
                            previous = exc
                        raise
        except Exception as exc:
            if self._is_transient(exc):
                # Out of time after a failed try: that try's error says why (a refused
                # TLS handshake, a wrong password), "no time left" does not.
                cause = previous if isinstance(exc, _OutOfTime) and previous is not None else exc
                prefix = f"{subject}: " if subject else ""
                raise DatabaseUnavailable(
                    f"{prefix}the {self.dialect.name} database is unavailable: {cause or type(cause).__name__}"
                ) from cause
            raise
        raise AssertionError("unreachable: tenacity re-raises")  # pragma: no cover

    def transaction(
        self,
        operation: Callable[[Any], T],
        *,
        timeout: float | None = None,
        subject: str | None = None,
        read_committed: bool = False,
    ) -> T:
        """Like :meth:`run`, inside one transaction (BEGIN IMMEDIATE on SQLite).

        ``read_committed``: on MySQL, this transaction reads what is committed
        at each statement, and its locking reads lock the rows they find,
        never the gaps between them (its default, REPEATABLE READ, does both).
        """
        dialect = self.dialect
        return self.run(
            lambda cursor: in_transaction(cursor, dialect, operation, read_committed=read_committed),
            timeout=timeout,
            subject=subject,
        )

    def close(self, *, retire: Iterable[threading.Thread] = ()) -> None:
        """Close every connection this process opened; one in use is aborted and closed by its user.

        The object stays usable: a later operation opens new connections,
        except on the ``retire`` threads (loops that would not stop in time):
        their next operation fails instead of reconnecting, so they see their stop.
        """
        self._retired = {thread for thread in self._retired if thread.is_alive()}
        self._retired.update(retire)
        state = self._current()
        with state.lock:
            idle = [conn for conn in state.open if not conn.busy]
            busy = [conn for conn in state.open if conn.busy]
            for conn in state.open:
                conn.doomed = True
            state.open.clear()
            state.idle.clear()
            state.pooled = 0
            state.local = threading.local()
            state.lock.notify_all()
        for conn in busy:
            # Shut down under its user, so that a close never waits on a
            # reader blocked on a dead network path.
            conn.abort()
        for conn in idle:
            conn.close()
        state.watchdog.stop()

    # -- retries -----------------------------------------------------------------

    def _is_transient(self, exc: BaseException) -> bool:
        """Worth trying again until the timeout, and DatabaseUnavailable after it."""
        return isinstance(exc, _Unreachable) or self.connector.is_transient(exc)

    def _retrying(self, timeout: float | None) -> tenacity.Retrying:
        stop: Any = tenacity.stop_never if timeout is None else tenacity.stop_after_delay(timeout)
        backoff = tenacity.wait_random_exponential(multiplier=0.05, max=2.0)

        def wait(state: tenacity.RetryCallState) -> float:
            # Never sleep past the timeout: the last try comes at it, not after.
            pause = backoff(state)
            if timeout is None or state.seconds_since_start is None:
                return pause
            return max(0.0, min(pause, timeout - state.seconds_since_start))

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(self._is_transient),
            wait=wait,
            stop=stop,
            before_sleep=self._before_retry,
            reraise=True,
        )

    def _before_retry(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None and (isinstance(exc, _Unreachable) or self.connector.is_connection_error(exc)):
            logger.warning("the %s database did not answer (%s); reconnecting", self.dialect.name, exc)
        else:
            # Contention (a deadlock, a lock wait, SQLite busy) is normal under load.
            logger.debug("the %s database was busy (%s); trying again", self.dialect.name, exc)

    # -- one attempt ---------------------------------------------------------------

    def _current(self) -> _ProcessState:
        state = self._state
        if state.pid != os.getpid():
            # A forked child: its parent's connections stay the parent's.
            self._parents.append(state)
            state = self._state = _ProcessState()
        return state

    def _attempt_past_locks(self, operation: Callable[[Any], T], endtime: float | None) -> T:
        """One attempt, tried again in short steps until its end while it meets contention.

        Short steps, not the backoff an outage gets: SQLite's connections do
        not wait for locks, and on a server the victim of a deadlock (a
        dispatch's INSERT against a claim, say) can go again at once, as the
        other transaction has its locks.
        """
        try:
            return self._attempt(operation, endtime)
        except Exception as exc:
            if not self.connector.is_contention(exc):
                raise
            logger.debug("the %s database met contention (%s); trying again at once", self.dialect.name, exc)
        give_up = _attempt_end(endtime)
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception(self.connector.is_contention),
            wait=tenacity.wait_random_exponential(multiplier=LOCK_STEPS[0], max=LOCK_STEPS[1]),
            stop=lambda state: time.monotonic() + LOCK_STEPS[1] >= give_up,
            reraise=True,
        ):
            with attempt:
                return self._attempt(operation, endtime)
        raise AssertionError("unreachable: tenacity re-raises")  # pragma: no cover

    def _attempt(self, operation: Callable[[Any], T], endtime: float | None) -> T:
        state = self._current()
        conn = self._acquire(state, endtime)
        healthy = False
        try:
            attempt_end = _attempt_end(endtime)
            token = state.watchdog.arm(conn, attempt_end)
            try:
                cursor = conn.raw.cursor()
                try:
                    result = operation(cursor)
                except BaseException:
                    with contextlib.suppress(Exception):  # the operation's error is the one to see
                        cursor.close()
                    raise
                cursor.close()
            finally:
                state.watchdog.disarm(token)
            # Aborted just as it finished: the result stands, the connection does not.
            healthy = not conn.aborted
            return result
        except Exception as exc:
            healthy = not (conn.aborted or self.connector.is_connection_error(exc))
            if conn.aborted:
                raise _Unreachable("no answer in time") from exc
            raise
        finally:
            self._release(state, conn, healthy)

    def _acquire(self, state: _ProcessState, endtime: float | None) -> _Connection:
        if self._retired and threading.current_thread() in self._retired:
            raise QueueError(f"the {self.dialect.name} connections of this thread were closed")
        local = state.local
        if getattr(local, "relaxed", False):
            conn: _Connection | None = getattr(local, "conn", None)
            if conn is None or conn.doomed:
                conn = self._open(endtime, relaxed=True)
                conn.dedicated = True
                local.conn = conn
            with state.lock:
                state.open.add(conn)
                conn.busy = True
            return conn
        with state.lock:
            while True:
                if state.idle:
                    conn = state.idle.pop()
                    conn.busy = True
                    return conn
                if state.pooled < self.pool_size:
                    state.pooled += 1
                    break
                remaining = None if endtime is None else endtime - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise _Unreachable(f"all {self.pool_size} connections stayed busy")
                state.lock.wait(remaining)
        try:
            conn = self._open(endtime, relaxed=False)
        except BaseException:
            with state.lock:
                state.pooled -= 1
                state.lock.notify()
            raise
        with state.lock:
            state.open.add(conn)
            conn.busy = True
        return conn

    def _release(self, state: _ProcessState, conn: _Connection, healthy: bool) -> None:
        with state.lock:
            conn.busy = False
            # A doomed connection left the books when close() doomed it.
            keep = healthy and not conn.doomed
            if not keep and not conn.doomed:
                state.open.discard(conn)
                if not conn.dedicated:
                    state.pooled -= 1
            if not conn.dedicated:
                if keep:
                    state.idle.append(conn)
                state.lock.notify()
        if not keep:
            if conn.dedicated and getattr(state.local, "conn", None) is conn:
                state.local.conn = None
            conn.close()

    def _open(self, endtime: float | None, *, relaxed: bool) -> _Connection:
        pending = _PendingConnect(lambda: self._connect(relaxed))
        if endtime is None:
            pending.run()  # bounded by the dialect's own connect timeout
            return pending.wait(0)
        remaining = endtime - time.monotonic()
        if remaining <= 0:
            raise _OutOfTime("no time left to connect")
        thread = threading.Thread(target=pending.run, name="syncjobs-connect", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # the interpreter is exiting: connect here, bounded by the dialect's timeout
            pending.run()
            return pending.wait(0)
        return pending.wait(remaining)

    def _connect(self, relaxed: bool) -> _Connection:
        raw = self.connector.connect()
        try:
            session = [self.dialect.no_lock_wait]
            session.append(self.dialect.relaxed_session if relaxed else self.dialect.caller_session)
            cursor = raw.cursor()
            try:
                for statement in session:
                    if statement:
                        cursor.execute(statement)
            finally:
                cursor.close()
            abort, close = self.dialect.abort_handles(raw)
        except BaseException:
            with contextlib.suppress(Exception):
                raw.close()
            raise
        return _Connection(raw, abort, close)


def _attempt_end(endtime: float | None) -> float:
    """When an attempt begun now must end: ATTEMPT_TIMEOUT from now, or the operation's end if sooner."""
    end = time.monotonic() + ATTEMPT_TIMEOUT
    return end if endtime is None else min(end, endtime)


def in_transaction(cursor: Any, dialect: Dialect, operation: Callable[[Any], T], *, read_committed: bool = False) -> T:
    """``operation(cursor)`` between BEGIN and COMMIT, rolled back if it raises (see ``Connections.transaction``)."""
    if read_committed and dialect.name == "mysql":
        cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")  # the next transaction only
    cursor.execute(dialect.begin)
    try:
        result = operation(cursor)
    except BaseException:
        try:
            cursor.execute("ROLLBACK")
        except Exception:  # the connection may be gone: the server rolls back
            logger.debug("rollback failed", exc_info=True)
        raise
    cursor.execute("COMMIT")
    return result
