"""The fetcher: claims rows for this process's workers, hands them over, and recovers expired leases.

One fetcher thread claims up to one row per idle worker plus ``prefetch``
rows ahead, in one statement or transaction, and puts them on a local queue
that the workers take from. Claimed rows are ``claimed``; a worker takes one
without waiting, and if its outcome is not written ``mark_after`` seconds
later (a run still going, or a write late or failing) the fetcher marks its
row ``running`` (with the claim that refills the buffer if one is due: on
PostgreSQL in the same statement, elsewhere in the same transaction). A run
written back sooner is never marked: most jobs cost no write between their
claim and their outcome. Lease recovery spends an attempt only
for ``running`` rows, so a killed process's buffer costs its jobs nothing. A
``claimed`` row it puts back is flagged, and its next claim makes it
``running`` at once: a job that kills its worker before its mark was written
spends its attempt on its next run at the latest, so a job that always kills
its worker still ends as a dead letter.

A row that cannot be decoded, whatever its columns hold, becomes a dead
letter with the reason, in the claim and in lease recovery alike: one bad row
never stops the queue.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import json
import logging
import math
import queue as stdqueue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ..envelope import ClaimedEnvelope
from ..job import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from ..limits import LimitKey
from ..payload import a_kind
from .claim_floor import ClaimFloor
from .dialect import Dialect
from .mysql import MYSQL
from .permits import Claimed, Permits
from .postgres import POSTGRES
from .schema import DONE_COUNTS_KEPT, FINISHED_KEPT

logger = logging.getLogger("syncjobs.database")

T = TypeVar("T")

#: After a dispatch inside a caller's transaction, the fetcher looks again
#: this soon, then twice as late each time, up to ``poll_interval``: the wake
#: at dispatch came before the caller's commit, and no driver says when that is.
SOON_FIRST = 0.01

#: A wake-up this soon after the last claim began waits out the rest: jobs
#: dispatched one by one then come in one claim, not a claim (and a
#: completion) each, which would cost the workers more than the dispatches
#: and slow the dispatching processes beside them. A lone job is not delayed.
CLAIM_COALESCE = 0.005

#: While this process claimed over ``STREAM_RATE`` jobs a second in the last
#: ``STREAM_SPAN`` seconds, a wake-up waits this long after the last claim
#: instead: each claim then carries dozens of jobs, which on a server halves
#: the workers' and the server's work per job and leaves it to the processes
#: that dispatch. Slower jobs still wait at most ``CLAIM_COALESCE``. The span
#: is long enough that two jobs close together make no stream (a rate from
#: one claim did: at 100 random arrivals a second, half the jobs waited the
#: long window).
CLAIM_COALESCE_STREAM = 0.03
STREAM_RATE = 150.0
STREAM_SPAN = 0.25

#: The first rest after a claim that came back short while rows were due (locked by another
#: transaction); each next one twice as long, up to ``poll_interval``.
LOCKED_BACKOFF = 0.01

#: A run is marked ``running`` in the table if its outcome is not written
#: this long after it was taken (at most a tenth of the lease): the many jobs
#: that end sooner cost no write for it, and a run killed sooner is counted on
#: its next run instead (see above).
MARK_AFTER = 0.1


class Runner(Protocol):
    def run(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T: ...

    def transaction(
        self, operation: Callable[[Any], T], *, deadline: float | None = None, read_committed: bool = False
    ) -> T: ...


class Undecodable(Exception):
    """A row whose columns cannot make an envelope; the message says why."""


class _Wake:
    """Put on the local queue to wake one blocked worker."""


_WAKE = _Wake()


def decode_row(row: Sequence[Any], token: str | None, carry: dict[str, contextvars.ContextVar[Any]]) -> ClaimedEnvelope:
    """An envelope of ``(id, name, payload, context, attempt, max_attempts[, run_at, priority])``.

    :class:`Undecodable` if the row cannot make one.
    """
    job_id, name, payload, context, attempt, max_attempts = row[:6]
    _check_text(name, "name")
    _check_text(payload, "payload")
    return ClaimedEnvelope(
        str(job_id),
        name,
        payload,
        _count(max_attempts, "max_attempts"),
        attempt=_count(attempt, "attempt"),
        context=_context(context, carry),
        lease=token,
        priority=row_priority(row[7]) if len(row) > 7 else DEFAULT_PRIORITY,
    )


def _check_text(value: Any, column: str) -> None:
    if not isinstance(value, str):
        raise Undecodable(f"its {column} is not text ({a_kind(value)})")
    if not value.isascii():  # ASCII is UTF-8; most payloads are, and the check costs no copy
        _check_utf8(value, column)


def _check_utf8(value: str, column: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Undecodable(f"its {column} is not valid UTF-8 ({exc.reason} at {exc.start})") from None


def _count(value: Any, column: str) -> int:
    if type(value) is int and -(2**31) <= value <= 2**31:
        return value
    # SQLite keeps whatever was written, whatever the column's type.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or abs(value) > 2**31:
        raise Undecodable(f"its {column} is not a number: {str(value)[:40]!r}")
    return int(value)


def _context(carried: Any, carry: dict[str, contextvars.ContextVar[Any]]) -> contextvars.Context:
    context = contextvars.Context()
    if carried is None or carried == "":
        return context
    if not isinstance(carried, str):
        raise Undecodable(f"its carried context is not text ({a_kind(carried)})")
    _check_utf8(carried, "carried context")
    # Running without the variables the dispatcher carried (a tenant, a
    # user) could act for the wrong one: a context that does not decode is
    # a reason not to run at all.
    try:
        values = json.loads(carried)
    except RecursionError:
        raise Undecodable("its carried context is nested too deeply to decode") from None
    except ValueError as exc:
        raise Undecodable(f"its carried context is not JSON: {exc}") from None
    if not isinstance(values, dict):
        raise Undecodable(f"its carried context is not a JSON object ({a_kind(values)})")
    for name, value in values.items():
        var = carry.get(name)
        if var is not None:
            context.run(var.set, value)
    return context


def row_priority(value: Any) -> int:
    """A row's priority; the default for one that is no number (SQLite keeps whatever was written)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return DEFAULT_PRIORITY


def _place(row: Sequence[Any]) -> tuple[int, float]:
    """A claimed row's priority and due time (its last two columns)."""
    try:
        due = float(row[6])
    except (TypeError, ValueError):
        due = -math.inf
    return row_priority(row[7]), due


def salvage(row: Sequence[Any], token: str | None) -> ClaimedEnvelope:
    """What can be read of an undecodable row, for its dead letter: no context, counts that are numbers."""
    job_id, name, payload, _context_text, attempt, max_attempts = row[:6]

    def text(value: Any) -> str:
        return str(value).encode("utf-8", "replace").decode("utf-8")

    def count(value: Any, default: int) -> int:
        try:
            return _count(value, "")
        except Undecodable:
            return default

    return ClaimedEnvelope(
        str(job_id),
        text(name),
        text(payload),
        count(max_attempts, 1),
        attempt=count(attempt, 0),
        context=contextvars.Context(),
        lease=token,
    )


class Fetcher:
    """Claims rows of one queue for the workers of this process and hands them over."""

    def __init__(
        self,
        runner: Runner,
        sql: dict[str, str],
        dialect: Dialect,
        *,
        queue: str,
        owner: str,
        lease: float,
        poll_interval: float,
        prefetch: int,
        carry: dict[str, contextvars.ContextVar[Any]],
        on_dead: Callable[[ClaimedEnvelope, str], None],
        hold: Callable[[Sequence[ClaimedEnvelope]], None] = lambda envelopes: None,
        floor: ClaimFloor | None = None,
        coalesce: float = CLAIM_COALESCE,
        stream_coalesce: float = CLAIM_COALESCE_STREAM,
        prune_keys: Callable[[Any], object] = lambda cursor: None,
        permits: Permits | None = None,
        tend_limits: Callable[[], object] = lambda: None,
    ) -> None:
        self._runner = runner
        #: ``prune_keys(cursor)`` deletes unique keys no job holds (housekeeping).
        self._prune_keys = prune_keys
        #: Limits: ``limit_of(envelope)`` is a claimed job's limit key (None for most; see ``StoreQueue``),
        #: ``permits`` admits the jobs that have one; housekeeping calls ``tend_limits()``.
        self.limit_of: Callable[[ClaimedEnvelope], LimitKey | None] | None = None
        self._permits = permits
        self._tend_limits = tend_limits
        #: Whether the last claim sent rows back to wait for their limits: then it claims again at once.
        self._sent_back = False
        self._sql = sql
        self._dialect = dialect
        self.queue = queue
        self.owner = owner
        self.lease = lease
        self.poll_interval = poll_interval
        #: Rows claimed ahead of the workers that wait for them.
        self.prefetch = prefetch
        self._carry = carry
        self._on_dead = on_dead
        #: Seconds a cancelled job stays in the table before housekeeping deletes it (the queue's keep_result).
        self.keep_cancelled = 600.0
        #: Called with each claimed batch before a worker can take it: its lease is renewed from then on.
        self._hold = hold
        self._ready: stdqueue.SimpleQueue[ClaimedEnvelope | _Wake] = stdqueue.SimpleQueue()
        #: Seconds the last rest lasted while due rows could not be claimed (locked); doubles, to poll_interval.
        self._locked_backoff = 0.0
        # Workers waiting in take() and envelopes buffered for them: the
        # fetcher claims the difference, so it never hoards rows.
        self._want = threading.Condition()
        self._waiting = 0
        self._buffered = 0
        # Envelopes handed to a worker and not yet finished or given back,
        # and claims between their commit and the local queue.
        self._inflight = 0
        self._claiming = 0
        self._claims_begun = 0
        #: Ids of buffered rows claimed ahead, still 'claimed' in the table.
        self._unstarted: set[str] = set()
        #: Envelopes taken from the buffer whose rows are still 'claimed', with when their runs
        #: began: the fetcher marks those not settled ``mark_after`` seconds later. A run whose
        #: outcome is written sooner is never marked; one whose write is late or failing is, so
        #: that its row, if it comes back by its lease, comes back with its run spent.
        self._to_mark: dict[str, tuple[ClaimedEnvelope, float]] = {}
        self.mark_after = min(MARK_AFTER, lease / 10)
        self._kick = threading.Event()
        self._soon_step = 0.0
        self._last_claim = -math.inf
        self._coalesce = coalesce
        self._stream_coalesce = max(coalesce, stream_coalesce)
        #: When each of the claims of the last STREAM_SPAN seconds began, and the rows it took.
        self._recent_claims: collections.deque[tuple[float, int]] = collections.deque()
        self._recent_rows = 0
        self._floor = floor or ClaimFloor()

    # -- the workers' side ---------------------------------------------------

    def take(self) -> ClaimedEnvelope | None:
        """The next claimed envelope for a worker; None when woken."""
        with self._want:
            self._waiting += 1
            self._want.notify_all()
        item = self._ready.get()
        with self._want:
            self._waiting -= 1
            if isinstance(item, _Wake):
                return None
            self._buffered -= 1
            self._inflight += 1
            if item.id in self._unstarted:
                self._unstarted.discard(item.id)
                self._to_mark[item.id] = (item, time.monotonic())
                if len(self._to_mark) == 1:  # the loop may be waiting with no mark due
                    self._want.notify_all()
        return item

    def settled(self, envelopes: Sequence[ClaimedEnvelope]) -> None:
        """These taken envelopes' outcomes were written or given up."""
        with self._want:
            self._inflight -= len(envelopes)
            for envelope in envelopes:
                self._to_mark.pop(envelope.id, None)

    def wake(self, count: int) -> None:
        for _ in range(count):
            self._ready.put(_WAKE)

    def kick(self) -> None:
        """New rows may be ready: claim now."""
        self._kick.set()

    def kick_soon(self) -> None:
        """Rows were inserted in a transaction not yet committed: look again soon, and a few times more."""
        self._soon_step = SOON_FIRST
        self._kick.set()

    def idle_mark(self) -> int | None:
        """None while anything is claimed here; else a number that changes with every claim begun."""
        with self._want:
            busy = self._inflight or self._buffered or self._claiming
            return None if busy else self._claims_begun

    def stop(self) -> None:
        """Wake the loop so that it sees its stop event."""
        self._kick.set()
        with self._want:
            self._want.notify_all()

    def unclaimed(self) -> list[ClaimedEnvelope]:
        """The envelopes no worker took (after the loop stopped): the caller gives them back."""
        left: list[ClaimedEnvelope] = []
        while True:
            try:
                item = self._ready.get_nowait()
            except stdqueue.Empty:
                break
            if isinstance(item, ClaimedEnvelope):
                left.append(item)
        with self._want:
            self._buffered = 0
            self._unstarted.clear()
            self._to_mark = {}
        return left

    # -- the loop --------------------------------------------------------------

    def loop(self, stop: threading.Event) -> None:
        next_recovery = 0.0
        recovery_interval = min(self.lease / 2, 5.0)
        while not stop.is_set():
            with self._want:
                # Also wake for lease recovery: the rows of a dead worker must
                # come back even while every worker here is busy.
                while (
                    not stop.is_set()
                    and self._waiting + self.prefetch - self._buffered <= 0
                    and time.monotonic() < min(next_recovery, self._next_mark())
                ):
                    self._want.wait(max(0.0, min(next_recovery, self._next_mark()) - time.monotonic()))
                want = self._waiting + self.prefetch - self._buffered
                to_mark = self._due_marks()
            if stop.is_set():
                return
            try:
                if time.monotonic() >= next_recovery:
                    self.recover_expired()
                    next_recovery = time.monotonic() + recovery_interval
                if want <= 0:
                    if to_mark:
                        self._runner.run(functools.partial(self._mark_rows, batch=to_mark), deadline=self.lease)
                    continue
                with self._want:
                    self._claiming += 1
                    self._claims_begun += 1
                    self._last_claim = time.monotonic()
                try:
                    claimed = self.claim_batch(want, to_mark)
                except BaseException:
                    with self._want:
                        self._claiming -= 1
                    raise
            except Exception:
                if stop.is_set():  # closing: its connections may be gone already
                    return
                with self._want:  # marked with the next pass
                    self._to_mark.update({e.id: (e, 0.0) for e in to_mark})
                logger.exception("claiming jobs from the %s database failed; trying again", self._dialect.name)
                stop.wait(self.poll_interval)
                continue
            with self._want:
                self._claiming -= 1
                self._buffered += len(claimed)
            if claimed:
                self._recent_claims.append((self._last_claim, len(claimed)))
                self._recent_rows += len(claimed)
                self._forget_claims_before(self._last_claim - STREAM_SPAN)
                self._hold(claimed)
                for envelope in claimed:
                    self._ready.put(envelope)
            if len(claimed) < want and not self._sent_back:
                # The queue is drained for now: the next rows come with a
                # wake-up or are due by the next look, and claiming again at
                # once would only find nothing.
                self._rest(stop, found=len(claimed))

    def _rest(self, stop: threading.Event, *, found: int) -> None:
        """Wait for a wake-up, the next parked row's due time or the next mark, at most ``poll_interval``."""
        look = self._next_look()
        if look <= 0:
            # A claim that came back short while rows are due: those are locked (a unique job's
            # dispatch keeps its waiting holder until it commits). Back off rather than spin.
            self._locked_backoff = min(max(2 * self._locked_backoff, LOCKED_BACKOFF), self.poll_interval)
            look = self._locked_backoff
        else:
            self._locked_backoff = 0.0
        with self._want:
            look = min(look, max(0.0, self._next_mark() - time.monotonic()))
            if self._unstarted:  # a worker may take one while this rests: its mark is due mark_after later
                look = min(look, self.mark_after)
        logger.debug("%d job(s) ready on queue %r; looking again in %.3gs or when woken", found, self.queue, look)
        if self._kick.wait(look):
            self._kick.clear()
            window = self._stream_coalesce if self._streaming() else self._coalesce
            stop.wait(self._last_claim + window - time.monotonic())

    def _streaming(self) -> bool:
        """Whether this process claimed over STREAM_RATE jobs a second in the last STREAM_SPAN seconds."""
        self._forget_claims_before(time.monotonic() - STREAM_SPAN)
        return self._recent_rows > STREAM_RATE * STREAM_SPAN

    def _forget_claims_before(self, since: float) -> None:
        recent = self._recent_claims
        while recent and recent[0][0] < since:
            self._recent_rows -= recent.popleft()[1]

    def _next_mark(self) -> float:
        """When the oldest unmarked run is due to be marked (``inf`` if none); under ``_want``."""
        if not self._to_mark:
            return math.inf
        return min(began for _, began in self._to_mark.values()) + self.mark_after

    def _due_marks(self) -> list[ClaimedEnvelope]:
        """Take the runs that have lasted ``mark_after`` seconds off ``_to_mark``; under ``_want``."""
        due = time.monotonic() - self.mark_after
        taken = [envelope for envelope, began in self._to_mark.values() if began <= due]
        for envelope in taken:
            del self._to_mark[envelope.id]
        return taken

    def _next_look(self) -> float:
        wait = self.idle_wait()
        step = self._soon_step
        if step:
            self._soon_step = step * 2 if step * 2 < self.poll_interval else 0.0
            wait = min(wait, step)
        return wait

    def idle_wait(self) -> float:
        """Seconds until the next parked row is due, at most ``poll_interval``."""

        def next_due(cursor: Any) -> float | None:
            soonest: float | None = None
            below = MAX_PRIORITY + 1
            for _ in range(MAX_PRIORITY - MIN_PRIORITY + 1):  # one look per priority the queue has
                cursor.execute(self._sql["NEXT_DUE"], (self.queue, below))
                row = cursor.fetchone()
                if row is None:
                    break
                due = float(row[1])
                soonest = due if soonest is None else min(soonest, due)
                if soonest <= 0:
                    break  # one is due already: no need to look further
                below = row_priority(row[0])
            return soonest

        try:
            due = self._runner.run(next_due, deadline=self.poll_interval)
        except Exception:
            logger.debug("looking for the next due row of queue %r failed", self.queue, exc_info=True)
            return self.poll_interval
        return self.poll_interval if due is None else max(0.0, min(due, self.poll_interval))

    # -- claims -----------------------------------------------------------------

    def claim_batch(self, want: int, to_mark: Sequence[ClaimedEnvelope] = ()) -> list[ClaimedEnvelope]:
        """Mark the rows of ``to_mark`` running, and claim up to ``want`` rows, in one statement or transaction."""
        token = str(uuid.uuid4())
        floor = self._floor.start()
        # From the start, or among the rows of the floor's priority from its due time on.
        where = (self.queue, want) if floor is None else (self.queue, *floor, want)
        variant = "" if floor is None else "_FLOOR"
        claim_params = ("claimed", self.owner, token, self.lease, *where)

        def mark_and_claim_returning(cursor: Any) -> list[tuple[Any, ...]]:
            if to_mark and self._dialect is POSTGRES:
                ids, tokens = [e.id for e in to_mark], sorted({e.lease for e in to_mark if e.lease})
                cursor.execute(self._sql["MARK_AND_CLAIM" + variant], (ids, tokens, *claim_params))
            else:
                self._mark_rows(cursor, to_mark)
                cursor.execute(self._sql["CLAIM_RETURNING" + variant], claim_params)
            return list(cursor.fetchall())

        def mark_and_claim(cursor: Any) -> list[tuple[Any, ...]]:
            self._mark_rows(cursor, to_mark)
            cursor.execute(self._sql["SELECT_READY" + variant], where)
            rows = list(cursor.fetchall())
            if rows:
                marks = ", ".join([self._dialect.placeholder] * len(rows))
                cursor.execute(
                    self._sql["MARK_CLAIMED"].replace("{ids}", marks),
                    ("claimed", self.owner, token, self.lease, *(row[0] for row in rows)),
                )
            return rows

        if not self._dialect.returning:
            rows = self._runner.transaction(mark_and_claim)
        elif to_mark and self._dialect is not POSTGRES:
            rows = self._runner.transaction(mark_and_claim_returning)
        else:
            rows = self._runner.run(mark_and_claim_returning)
        places = {row[0]: _place(row) for row in rows}
        # In the claim's order: an UPDATE … RETURNING returns its rows in any order.
        rows.sort(key=lambda row: (-places[row[0]][0], places[row[0]][1]))
        self._floor.claimed(floor, list(places.values()), want)
        envelopes: list[ClaimedEnvelope] = []
        for row in rows:
            try:
                envelope = decode_row(row, token, self._carry)
            except Undecodable as exc:
                self._poison(row, token, str(exc))
                continue
            envelopes.append(envelope)
        self._sent_back = False
        if self.limit_of is not None and envelopes:
            envelopes = self._admit(envelopes, self.limit_of, places, token)
        with self._want:
            self._unstarted.update(envelope.id for envelope in envelopes)
        return envelopes

    def _admit(
        self,
        envelopes: list[ClaimedEnvelope],
        limit_of: Callable[[ClaimedEnvelope], LimitKey | None],
        places: dict[str, tuple[int, float]],
        token: str,
    ) -> list[ClaimedEnvelope]:
        """The claimed envelopes that may run: those with a limit key get a permit, or go back to wait."""
        claimed: list[Claimed] = []
        for envelope in envelopes:
            limit = limit_of(envelope)
            if limit is not None:
                priority, run_at = places[envelope.id]
                claimed.append(Claimed(envelope, limit, priority, run_at if math.isfinite(run_at) else 0.0))
        if not claimed or self._permits is None:
            return envelopes
        permits = self._permits
        try:
            # Within a part of the lease: the rows of this claim are not renewed until it returns.
            sent_back, lost, let_go = self._runner.transaction(
                lambda cursor: permits.admit(cursor, claimed, token), deadline=self.lease / 3, read_committed=True
            )
        except Exception:
            # Their rows stay claimed, unheld: their leases expire and they come back untouched.
            logger.exception("admitting %d job(s) with limits failed; their leases will bring them back", len(claimed))
            limited = {each.envelope.id for each in claimed}
            return [envelope for envelope in envelopes if envelope.id not in limited]
        for each in claimed:
            if each.limit.running is not None:  # what the end of its run lets go
                each.envelope.limit = each.limit.digest
        if sent_back or let_go:  # claim again at once: there is more to take, or to send back
            self._sent_back = True
            logger.debug("%d job(s) of queue %r wait for their limits", len(sent_back), self.queue)
        if lost:  # an admission that came too late: another claim has them now
            logger.warning(
                "%d claimed job(s) of queue %r were claimed again before their admission", len(lost), self.queue
            )
        return [envelope for envelope in envelopes if envelope.id not in sent_back and envelope.id not in lost]

    def _poison(self, row: Sequence[Any], token: str, reason: str) -> None:
        envelope = salvage(row, token)
        error = f"this row cannot be run: {reason}"

        def write(cursor: Any) -> int:
            cursor.execute(self._sql["POISON"], (envelope.attempt, envelope.max_attempts, error, envelope.id, token))
            return int(cursor.rowcount)

        try:
            written = self._runner.run(write, deadline=self.lease)
        except Exception:
            logger.exception(
                "job %s: could not make its undecodable row a dead letter; lease recovery will", envelope.id
            )
            return
        if written:
            self._dead(envelope, error)

    def _dead(self, envelope: ClaimedEnvelope, error: str) -> None:
        try:
            self._on_dead(envelope, error)
        except Exception:
            logger.exception("job %s (%s): a dead-letter handler failed", envelope.name, envelope.id)

    def _mark_rows(self, cursor: Any, batch: Sequence[ClaimedEnvelope]) -> None:
        """Mark the rows of envelopes taken from the buffer 'running' (the claim token fences it)."""
        by_lease: dict[str | None, list[str]] = {}
        for envelope in batch:
            by_lease.setdefault(envelope.lease, []).append(envelope.id)
        for lease, ids in by_lease.items():
            if self._dialect is MYSQL:
                cursor.execute(self._ids("MARK_SELECT", len(ids)), (lease, *ids))
                ids = [str(row[0]) for row in cursor.fetchall()]  # noqa: PLW2901 - only those
                if not ids:
                    continue
            cursor.execute(self._ids("MARK_STARTED", len(ids)), (lease, *ids))

    def _ids(self, query: str, count: int) -> str:
        return self._sql[query].replace("{ids}", ", ".join([self._dialect.placeholder] * count))

    # -- lease recovery ----------------------------------------------------------

    def recover_expired(self) -> None:
        """Rows whose worker died: back to the queue (a run spent only if it started), or dead if it was the last."""

        def housekeeping(cursor: Any) -> None:
            # For stats: dead workers' rows, and done counts older than an hour;
            # and tombstones older than any dispatch retries.
            # Autocommitted, each on its own, so that they hold no lock across others.
            cursor.execute(self._sql["WORKERS_PRUNE"])
            cursor.execute(self._sql["DONE_PRUNE"], (self.queue, int(time.time()) - DONE_COUNTS_KEPT))
            cursor.execute(self._sql["FINISHED_PRUNE"], (FINISHED_KEPT,))
            cursor.execute(self._sql["RESULTS_PRUNE"])
            cursor.execute(self._sql["CANCELLED_PRUNE"], (self.queue, self.keep_cancelled))
            self._prune_keys(cursor)

        def recover(cursor: Any) -> list[tuple[ClaimedEnvelope, str | None]]:
            cursor.execute(self._sql["SELECT_EXPIRED"], (self.queue, 100))
            outcomes: list[tuple[ClaimedEnvelope, str | None]] = []
            for row in cursor.fetchall():
                started = row[6] == "running"
                try:
                    envelope = decode_row(row, None, self._carry)
                except Undecodable as exc:
                    envelope = salvage(row, None)
                    error = f"this row cannot be run: {exc}"
                    cursor.execute(
                        self._sql["POISON_EXPIRED"], (envelope.attempt, envelope.max_attempts, error, envelope.id)
                    )
                    outcomes.append((envelope, error))
                    continue
                if not started:
                    # Claimed ahead and not known to have started: no run spent.
                    cursor.execute(self._sql["REQUEUE_UNSTARTED"], (envelope.id,))
                    continue
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

        self._runner.run(housekeeping)
        for envelope, error in self._runner.transaction(recover):
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
                self._dead(envelope, error)
        try:
            self._tend_limits()
        except Exception:  # its failure must not stop lease recovery: the next round tries again
            logger.warning("tending the limits of queue %r failed", self.queue, exc_info=True)
