"""Unique jobs' keys in ``<table>_unique``: taken in the dispatch's transaction, before its rows are inserted.

The key is the table's primary key, so the database itself keeps two
dispatchers of one key, in any processes, from both taking it: the second
insert conflicts (waiting, on every database, for a first still uncommitted).
It then reads who holds the key and whether that job holds it still (queued,
or unfinished, or not yet expired). Only when it does not is the key taken
over, with the key's row locked: on PostgreSQL the holder is read again under
that lock, in a statement that starts after the lock was granted, so it sees
the job of anyone who took the key over meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..unique import UniqueKey
from . import queries
from .connections import in_transaction
from .dialect import Dialect
from .dialects import MYSQL, POSTGRES, SQLITE

#: The holder's states in which it holds its key, by how the key holds. A row a worker process
#: claimed ahead ('claimed') may have begun its run before it is marked 'running': it holds a key
#: held while queued no longer (a second run is the safe side: a first that began may have read
#: what the second dispatch was about).
_HOLDING = {"queued": frozenset({"queued"}), "unfinished": frozenset({"queued", "claimed", "running"})}
#: Keys looked at per page of a prune, and pages at most per prune (by a worker's housekeeping).
PRUNE_BATCH = 500
PRUNE_PAGES = 20


class UniqueKeys:
    def __init__(self, dialect: Dialect, table: str) -> None:
        sql = {name: dialect.sql(text, table) for name, text in vars(queries).items() if name.startswith("UNIQUE_")}
        self._sql = sql
        self._dialect = dialect
        #: Where the next prune's page starts (keys sort as text).
        self._position = ""
        self._take = sql["UNIQUE_TAKE_MYSQL" if dialect is MYSQL else "UNIQUE_TAKE"]
        if dialect is MYSQL:
            sql["UNIQUE_HOLDER_WAITS"] = sql["UNIQUE_HOLDER_WAITS_MYSQL"]
            sql["UNIQUE_FORGET"] = sql["UNIQUE_FORGET_MYSQL"]

    def take_all(self, cursor: Any, claims: Sequence[tuple[str, UniqueKey | None]]) -> list[str | None]:
        """For each (job id, key), None if the job took its key (or has none), else the id of the job holding it.

        In the caller's transaction. Keys are taken in one order (sorted), so
        that two dispatches of the same keys never wait for each other in a
        circle; a key given twice goes to the first job that gives it.
        """
        holders: list[str | None] = [None] * len(claims)
        # The first job of each key, by key.
        takers: dict[str, tuple[int, str, UniqueKey]] = {}
        for index, (job_id, key) in enumerate(claims):
            if key is not None:
                takers.setdefault(key.digest, (index, job_id, key))
        for digest in sorted(takers):
            index, job_id, key = takers[digest]
            holders[index] = self.take(cursor, job_id, key)
        for index, (_, key) in enumerate(claims):
            if key is not None:
                taker, taker_id, _ = takers[key.digest]
                if taker != index:  # a duplicate of its key's first job, or of what that one found
                    holders[index] = holders[taker] or taker_id
        return holders

    def take(self, cursor: Any, job_id: str, key: UniqueKey) -> str | None:
        """Take ``key`` for ``job_id``: None if taken (or it is ``job_id``'s already), else the holding job's id."""
        while True:
            cursor.execute(self._take, (key.digest, job_id, key.holds, key.seconds))
            # One row inserted: the key is this job's. MySQL may count a duplicate as one too (on a
            # caller's connection with CLIENT_FOUND_ROWS, as Django's are): there the holder is read.
            if cursor.rowcount == 1 and self._dialect is not MYSQL:
                return None
            # Locked already where the insert locked the row (MySQL) or the database (SQLite).
            locked = self._dialect is not POSTGRES
            while True:
                locking = locked and self._dialect is not SQLITE
                cursor.execute(self._sql["UNIQUE_HOLDER_LOCKED" if locking else "UNIQUE_HOLDER"], (key.digest,))
                row = cursor.fetchone()
                if row is None:
                    break  # pruned meanwhile: insert it again
                holder, holds, unexpired = str(row[0]), str(row[1]), bool(row[2])
                if holder == job_id:  # taken by this very insert, or by a try whose reply was lost
                    return None
                if self._holds(cursor, holder, holds, unexpired):
                    return holder
                if not locked:
                    locked = True  # read it again under the row's lock before taking it over
                    continue
                cursor.execute(self._sql["UNIQUE_RETAKE"], (job_id, key.holds, key.seconds, key.digest))
                return None

    def _holds(self, cursor: Any, holder: str, holds: str, unexpired: bool) -> bool:
        if holds == "seconds":
            return unexpired
        # On PostgreSQL a waiting holder is share-locked until this dispatch commits: it must not
        # begin before, or it would run without what the caller's transaction changed (a claim
        # skips a locked row). On MySQL every read of it is a locking read, which reads the rows
        # as they are now, not as a caller's older snapshot saw them. SQLite's write lock keeps
        # every claim out, and every other writer.
        locking = self._dialect is MYSQL or (self._dialect is POSTGRES and holds == "queued")
        cursor.execute(self._sql["UNIQUE_HOLDER_WAITS" if locking else "UNIQUE_HOLDER_STATE"], (holder,))
        row = cursor.fetchone()
        return row is not None and str(row[0]) in _HOLDING.get(holds, _HOLDING["unfinished"])

    def prune(self, cursor: Any, *, sweep: bool = False) -> int:
        """Delete keys no job holds any more; how many. Short transactions of their own, that wait for no lock.

        Expired keys, then the others a page of :data:`PRUNE_BATCH` at a
        time from where the last call stopped, on while pages come back
        mostly stale (jobs finish faster than one page a call), up to
        :data:`PRUNE_PAGES`. ``sweep``: all of them, once.
        """
        pages = 1_000_000 if sweep else PRUNE_PAGES
        forgotten = 0
        for _ in range(pages):
            cursor.execute(self._sql["UNIQUE_EXPIRED"], (PRUNE_BATCH,))
            expired = [(str(key), str(job_id)) for key, job_id in cursor.fetchall()]
            forgotten += self._forget(cursor, expired)
            if len(expired) < PRUNE_BATCH:
                break
        if sweep:
            self._position = ""
        for _ in range(pages):
            cursor.execute(self._sql["UNIQUE_PAGE"], (self._position, PRUNE_BATCH))
            page = [(str(key), str(job_id)) for key, job_id in cursor.fetchall()]
            last_page = len(page) < PRUNE_BATCH
            self._position = "" if last_page else page[-1][0]
            stale = self._stale(cursor, page)
            forgotten += self._forget(cursor, stale)
            if last_page or (not sweep and len(stale) * 2 < len(page)):
                break
        return forgotten

    def _forget(self, cursor: Any, pairs: list[tuple[str, str]]) -> int:
        """Delete these (key, job id) rows, but those a dispatch holds locked now (taking them over, maybe)."""
        if not pairs:
            return 0
        marks = self._marks(len(pairs))
        keys, ids = [key for key, _ in pairs], [job_id for _, job_id in pairs]
        forget = self._sql["UNIQUE_FORGET"].replace("{keys}", marks).replace("{ids}", marks)
        if self._dialect is SQLITE:  # a dispatch holds the database's write lock, not a row's
            cursor.execute(forget, keys + ids)
            return max(0, int(cursor.rowcount))

        def forget_free(cursor: Any) -> int:
            cursor.execute(self._sql["UNIQUE_FORGET_LOCK"].replace("{keys}", marks).replace("{ids}", marks), keys + ids)
            free = {str(row[0]) for row in cursor.fetchall()}
            left = [(key, job_id) for key, job_id in pairs if key in free]
            if not left:
                return 0
            more = self._marks(len(left))
            forget = self._sql["UNIQUE_FORGET"].replace("{keys}", more).replace("{ids}", more)
            cursor.execute(forget, [key for key, _ in left] + [job_id for _, job_id in left])
            return max(0, int(cursor.rowcount))

        # Read committed on MySQL: rows locked, not gaps.
        return in_transaction(cursor, self._dialect, forget_free, read_committed=True)

    def _stale(self, cursor: Any, page: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The keys of ``page`` whose jobs are gone or have ended."""
        if not page:
            return []
        ids = [job_id for _, job_id in page]
        cursor.execute(self._sql["UNIQUE_JOBS_ALIVE"].replace("{ids}", self._marks(len(ids))), ids)
        alive = {str(row[0]) for row in cursor.fetchall()}
        return [(key, job_id) for key, job_id in page if job_id not in alive]

    def _marks(self, count: int) -> str:
        return ", ".join([self._dialect.placeholder] * count)
