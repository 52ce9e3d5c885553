"""Concurrency and rate limits in a database: permits in ``<table>_permits``, a locked row a key in ``<table>_limits``.

A claim takes its rows as ever (one statement, no cost for jobs without a
limit); the rows it took that have a limit key then go through
:meth:`Permits.admit`, in one transaction that first locks those rows if
they are still leased by that claim (a late or replayed admission acts on
none that are not), then each key's row. Under that lock it counts the key's
permits in use, as the jobs are now (a permit whose job's claim ended, in
any way, a killed worker's lease included, is forgotten), and gives each job
one, or sends it back:

- over ``running`` (or behind jobs already waiting on its key): its row
  waits, due at :data:`WAITING_AT` (never, for a claim), with a 'waiting'
  permit that keeps its priority and due time;
- over the rate: its row is due at its turn, with a 'booked' permit.

A run that ends lets the next waiting jobs of its key go (:meth:`let_go`,
under the key's lock too, so that a job sent to wait by a claim not yet
committed is seen once it is): each gets a 'let_go' permit, a place kept for
it until its claim. Housekeeping does the same for the keys of its queue
with waiting jobs (making up for ends no process saw: a worker killed), and
forgets the permits of jobs gone and the keys nothing needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..envelope import ClaimedEnvelope
from ..limits import LimitKey, rate_turn
from . import queries
from .dialect import Dialect
from .dialects import MYSQL, SQLITE

#: A waiting job's due time: past any claim's reach (the year 33658), and a mark that it waits for a permit.
WAITING_AT = 1e12
#: Permits looked at per housekeeping, and keys with jobs waiting let go per housekeeping.
PRUNE_PAGE = 500
TEND_KEYS = 100
_LEASED = frozenset({"running", "claimed"})
_LIVE = frozenset({"queued", "running", "claimed"})
#: Free permits of a key that no longer limits its runs at once: all.
_ALL = 1_000_000


class Claimed(NamedTuple):
    """A claimed row with a limit key, and where it stood in the queue."""

    envelope: ClaimedEnvelope
    limit: LimitKey
    priority: int
    run_at: float


class Admission(NamedTuple):
    """What an admission did: the ids it sent back to wait, those no longer the claim's, and those it let go."""

    sent_back: set[str]
    lost: set[str]
    let_go: list[str]


class _InUse:
    """A key's permits in use: held by runs, and kept for jobs let go (by job id)."""

    def __init__(self, held: int, kept: set[str]) -> None:
        self.held = held
        self.kept = kept


class Permits:
    def __init__(self, dialect: Dialect, table: str, queue: str) -> None:
        names = ("LIMIT", "PERMIT")
        self._sql = {name: dialect.sql(text, table) for name, text in vars(queries).items() if name.startswith(names)}
        self._dialect = dialect
        self._queue = queue
        self._ensure = self._sql["LIMIT_ENSURE_MYSQL" if dialect is MYSQL else "LIMIT_ENSURE"]
        # SQLite's write transaction locks the whole database already.
        self._lock = "" if dialect is SQLITE else " FOR UPDATE"
        self._skip_locked = "" if dialect is SQLITE else " FOR UPDATE SKIP LOCKED"
        #: Where housekeeping's next page of permits, and of waiting keys, begins.
        self._prune_from = ""
        self._tend_from = ""

    def _marks(self, count: int) -> str:
        return ", ".join([self._dialect.placeholder] * count)

    # -- a claim's admission ---------------------------------------------------------

    def admit(self, cursor: Any, claimed: Sequence[Claimed], token: str) -> Admission:
        """Give each claimed row a permit, or send it back to wait. In the caller's transaction.

        Keys are locked in one order (sorted), so that two claims never wait
        for each other in a circle.
        """
        ids = [each.envelope.id for each in claimed]
        marks = self._marks(len(ids))
        cursor.execute(self._sql["PERMITS_STILL_CLAIMED"].replace("{ids}", marks) + self._lock, (*ids, token))
        ours = {str(row[0]) for row in cursor.fetchall()}
        cursor.execute(self._sql["PERMITS_OF"].replace("{ids}", marks), ids)
        permits = {str(row[0]): (str(row[1]), float(row[2])) for row in cursor.fetchall()}
        by_key: dict[str, list[Claimed]] = {}
        for each in claimed:
            if each.envelope.id in ours:
                by_key.setdefault(each.limit.digest, []).append(each)
        admission = Admission(set(), set(ids) - ours, [])
        for digest in sorted(by_key):
            self._admit_key(cursor, by_key[digest], permits, token, admission)
        return admission

    def _admit_key(
        self,
        cursor: Any,
        group: list[Claimed],
        permits: dict[str, tuple[str, float]],
        token: str,
        admission: Admission,
    ) -> None:
        limit = group[0].limit
        next_at, booked_until, now = self._key_row(cursor, limit)
        running = limit.running
        in_use = self._in_use(cursor, limit.digest, token) if running is not None else _InUse(0, set())
        waiting = running is not None and self._any_waiting(cursor, limit.digest)
        for each in group:
            job_id = each.envelope.id
            kind, origin = permits.get(job_id, (None, each.run_at))
            # Let go for a free permit, or back at its rate's turn: it has waited its turn already.
            its_turn = kind in ("let_go", "booked")
            in_use.kept.discard(job_id)
            if running is not None and (in_use.held + len(in_use.kept) >= running or (waiting and not its_turn)):
                self._send_back(cursor, each, token, kind="waiting", due=WAITING_AT, origin=origin)
                admission.sent_back.add(job_id)
                waiting = True
                continue
            if limit.interval is not None:
                booked_at = each.run_at if kind == "booked" else None
                turn = rate_turn(now, next_at, booked_until, limit.interval, booked_at=booked_at)
                next_at, booked_until = turn.next_at, turn.booked_until
                if not turn.begins:
                    self._send_back(cursor, each, token, kind="booked", due=turn.at, origin=origin)
                    admission.sent_back.add(job_id)
                    continue
            if kind is not None:
                cursor.execute(self._sql["PERMIT_DROP"], (job_id,))
            if running is not None:
                cursor.execute(self._sql["PERMIT_PUT"], (job_id, limit.digest, "held", token, each.priority, origin))
                in_use.held += 1
        cursor.execute(self._sql["LIMIT_WRITE"], (running, next_at, booked_until, limit.digest))
        if waiting and running is not None:
            # A place this claim freed (a job let go that its rate sent back to wait for its turn): the next goes.
            admission.let_go.extend(self._let_go_free(cursor, limit.digest, running - in_use.held - len(in_use.kept)))

    def _key_row(self, cursor: Any, limit: LimitKey) -> tuple[float, float, float]:
        """Lock the key's row (made if it is not there): its rate's next start and first turn unbooked, and now."""
        while True:
            cursor.execute(self._ensure, (limit.digest, self._queue, limit.running))
            cursor.execute(self._sql["LIMIT_READ"] + self._lock, (limit.digest,))
            row = cursor.fetchone()
            if row is not None:  # else housekeeping deleted it between the two: make it again
                return float(row[1]), float(row[2]), float(row[3])

    def _in_use(self, cursor: Any, digest: str, token: str | None = None) -> _InUse:
        """The key's permits in use; those whose jobs' claims ended (or jobs ended) are forgotten. Under its lock.

        Held permits of the claim ``token`` are left out: a try of its admission whose reply was lost gave them.
        """
        cursor.execute(self._sql["PERMITS_IN_USE"], (digest,))
        held, kept, ended = 0, set(), []
        for job_id, kind, permit_token, state, job_token in cursor.fetchall():
            if kind == "held" and state in _LEASED and job_token == permit_token:
                held += permit_token != token
            elif kind == "let_go" and state in _LIVE:
                kept.add(str(job_id))
            else:
                ended.append(str(job_id))
        for job_id in sorted(ended):  # in one order: two that forget the same permits never wait in a circle
            cursor.execute(self._sql["PERMIT_DROP"], (job_id,))
        return _InUse(held, kept)

    def _any_waiting(self, cursor: Any, digest: str) -> bool:
        cursor.execute(self._sql["PERMITS_ANY_WAITING"], (digest,))
        return cursor.fetchone() is not None

    def _send_back(self, cursor: Any, each: Claimed, token: str, *, kind: str, due: float, origin: float) -> None:
        """The claimed row due again at ``due``, with a permit of ``kind`` that keeps its place (``origin``)."""
        job_id = each.envelope.id
        cursor.execute(self._sql["PERMIT_WAIT"], (due, job_id, token))
        cursor.execute(self._sql["PERMIT_DROP"], (job_id,))
        cursor.execute(self._sql["PERMIT_PUT"], (job_id, each.limit.digest, kind, None, each.priority, origin))

    # -- ends ---------------------------------------------------------------------------

    def let_go(self, cursor: Any, digest: str) -> list[str]:
        """As many jobs waiting on the key as it has permits free, due again; their ids. In the caller's transaction."""
        cursor.execute(self._sql["LIMIT_READ"] + self._lock, (digest,))
        row = cursor.fetchone()
        if row is None:
            return []
        in_use = self._in_use(cursor, digest)
        # A key whose limit is no longer ``running`` (its class changed): whatever waits goes.
        free = _ALL if row[0] is None else int(row[0]) - in_use.held - len(in_use.kept)
        return self._let_go_free(cursor, digest, free)

    def _let_go_free(self, cursor: Any, digest: str, free: int) -> list[str]:
        """Under the key's lock: up to ``free`` jobs waiting on it due again, each with a permit kept for it."""
        let_go: list[str] = []
        while free > 0:
            cursor.execute(self._sql["PERMITS_WAITING"], (digest, min(free, 1000)))
            waiting = [(str(job_id), float(run_at)) for job_id, run_at in cursor.fetchall()]
            if not waiting:
                break
            for job_id, run_at in waiting:
                cursor.execute(self._sql["PERMIT_LET_GO"], (run_at, job_id, WAITING_AT))
                if cursor.rowcount:
                    cursor.execute(self._sql["PERMIT_KIND"], ("let_go", job_id))
                    let_go.append(job_id)
                    free -= 1
                else:  # cancelled meanwhile: the next goes instead
                    cursor.execute(self._sql["PERMIT_DROP"], (job_id,))
        return let_go

    # -- housekeeping ---------------------------------------------------------------------

    def waiting_keys(self, cursor: Any) -> list[str]:
        """The next page of this queue's keys with jobs waiting (each call goes on from the last)."""
        cursor.execute(self._sql["PERMITS_WAITING_KEYS"], (self._queue, self._tend_from, TEND_KEYS))
        keys = [str(row[0]) for row in cursor.fetchall()]
        self._tend_from = keys[-1] if len(keys) == TEND_KEYS else ""
        return keys

    def prune(self, cursor: Any) -> None:
        """Forget the permits of a page whose jobs are gone (held) or no longer live (the others)."""
        cursor.execute(self._sql["PERMITS_PAGE"] + self._skip_locked, (self._prune_from, PRUNE_PAGE))
        page = [str(row[0]) for row in cursor.fetchall()]
        self._prune_from = page[-1] if len(page) == PRUNE_PAGE else ""
        if page:
            cursor.execute(self._sql["PERMITS_PRUNE"].replace("{ids}", self._marks(len(page))), page)

    def any_keys(self, cursor: Any) -> bool:
        """Whether this queue has limit keys in the table (left by this version of its jobs, or an earlier)."""
        cursor.execute(self._sql["LIMITS_ANY"], (self._queue,))
        return cursor.fetchone() is not None

    def unused_keys(self, cursor: Any) -> list[str]:
        cursor.execute(self._sql["LIMITS_UNUSED"], (self._queue,))
        return [str(row[0]) for row in cursor.fetchall()]

    def forget_key(self, cursor: Any, digest: str) -> None:
        """Delete the key's row if, under its lock, it has no permits (a claim may have just given one)."""
        cursor.execute(self._sql["LIMIT_READ"] + self._lock, (digest,))
        if cursor.fetchone() is None:
            return
        cursor.execute(self._sql["LIMIT_USED"], (digest,))
        if not int(cursor.fetchone()[0]):
            cursor.execute(self._sql["LIMIT_DELETE"], (digest,))
