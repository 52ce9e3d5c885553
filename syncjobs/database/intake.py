"""Dispatch's inserts: statements sized to the server's limit, and retries that never duplicate a job.

A dispatch's connection can fail after the server committed it (the reply was
lost). The store then tries again, and the second try must neither fail on
the row that is already there nor insert again a job that ran and was
deleted in between. So a retry inserts only the rows that are absent, and of
those only the ones without a tombstone: the completer writes one per
finished job, in the transaction that deletes its row, and they are kept for
an hour. On PostgreSQL and SQLite the retry inserts first
(``ON CONFLICT DO NOTHING RETURNING id``) and then deletes, before its commit,
what it inserted for a tombstoned id: an insert that did not conflict means
the old row, if any, was deleted in a transaction that committed before, so
its tombstone is seen. On MySQL the retry first reads its ids with
``FOR UPDATE``, whose gap locks keep a first try still in flight from
committing, then checks the tombstones, then inserts what is left.

On MySQL a statement larger than ``max_allowed_packet`` makes the server drop
the connection; batches are cut below it, and one job that cannot fit is a
``QueueError`` before anything is inserted.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from ..envelope import Envelope
from ..errors import QueueError
from .connections import in_transaction
from .dialect import Dialect
from .dialects import MYSQL, POSTGRES

#: Rows in one INSERT at most. Multi-row VALUES, built of placeholders only:
#: one round trip per statement on every driver (PyMySQL's executemany would
#: not batch an INSERT that has SQL expressions in it).
ROWS_PER_STATEMENT = 500
#: Bytes kept free under ``max_allowed_packet`` for the statement's own text and the protocol.
PACKET_MARGIN = 4096


class Intake:
    def __init__(
        self,
        sql: dict[str, str],
        dialect: Dialect,
        channel: Callable[[], str],
        is_contention: Callable[[BaseException], bool],
    ) -> None:
        self._sql = sql
        self._dialect = dialect
        self._channel = channel
        self._is_contention = is_contention
        self._insert_cache: dict[int, str] = {}
        #: MySQL's max_allowed_packet, read once (on the first dispatch).
        self._packet_limit: int | None = None

    # -- statements --------------------------------------------------------------

    def _values(self, rows: int) -> str:
        sql = self._insert_cache.get(rows)
        if sql is None:
            values = ", ".join([self._sql["INSERT_ROW"]] * rows)
            sql = self._insert_cache[rows] = f"{self._sql['INSERT_INTO']} {values}"
        return sql

    def insert_sql(self, rows: int) -> str:
        """The first try's statement for ``rows`` rows (on PostgreSQL with its NOTIFY)."""
        if self._dialect is POSTGRES:
            # The same statement wakes the other processes' workers: the
            # NOTIFY is delivered at commit, so a rolled-back dispatch wakes
            # nobody, and it carries a job id, nothing from the job itself.
            return self._sql["INSERT_AND_NOTIFY"].replace("{insert}", self._values(rows))
        return self._values(rows)

    def _ids(self, query: str, count: int) -> str:
        return self._sql[query].replace("{ids}", ", ".join([self._dialect.placeholder] * count))

    # -- one dispatch -------------------------------------------------------------

    def operation(
        self, items: Sequence[tuple[Envelope, float]], params: Sequence[tuple[Any, ...]], *, own_transaction: bool
    ) -> Callable[[Any], None]:
        """``insert(cursor)`` for :meth:`DatabaseStore.run`: a plain insert first, an idempotent one when tried again.

        ``own_transaction``: a retry opens and commits its own transaction
        (the first try was one autocommitted statement). A try refused by
        contention (a lock, a deadlock) wrote nothing, so the next one is
        plain again: the idempotent one holds locks longer, just when others
        wait for them.
        """
        plain = True

        def insert(cursor: Any) -> None:
            nonlocal plain
            batches = self._batches(cursor, items, params)
            if plain:
                plain = False  # until this try is known to have written nothing
                try:
                    for batch in batches:
                        cursor.execute(self.insert_sql(len(batch)), self._flat(batch))
                except Exception as exc:
                    plain = self._is_contention(exc)
                    raise
                return
            if not own_transaction:
                self._insert_absent(cursor, batches)
                return
            in_transaction(cursor, self._dialect, lambda c: self._insert_absent(c, batches))

        return insert

    def _flat(self, batch: Sequence[tuple[Any, ...]]) -> list[Any]:
        values = [value for row in batch for value in row]
        if self._dialect is POSTGRES:
            values.append(self._channel())
        return values

    def insert(
        self,
        cursor: Any,
        items: Sequence[tuple[Envelope, float]],
        params: Sequence[tuple[Any, ...]],
        *,
        idempotent: bool,
    ) -> None:
        """Insert the rows in the caller's transaction; ``idempotent``, only those absent, of jobs not finished."""
        batches = self._batches(cursor, items, params)
        if idempotent:
            self._insert_absent(cursor, batches)
            return
        for batch in batches:
            cursor.execute(self.insert_sql(len(batch)), self._flat(batch))

    def _insert_absent(self, cursor: Any, batches: list[list[tuple[Any, ...]]]) -> None:
        for batch in batches:
            if self._dialect is MYSQL:
                ids = [row[0] for row in batch]
                cursor.execute(self._ids("LOCK_IDS", len(ids)), ids)
                present = {str(row[0]) for row in cursor.fetchall()}
                absent = [job_id for job_id in ids if job_id not in present]
                finished = self._finished(cursor, absent)
                rows = [row for row in batch if row[0] not in present and row[0] not in finished]
                if rows:
                    cursor.execute(self._values(len(rows)), [value for row in rows for value in row])
                continue
            values = [value for row in batch for value in row]
            cursor.execute(self._values(len(batch)) + self._sql["INSERT_IF_ABSENT"], values)
            inserted = [str(row[0]) for row in cursor.fetchall()]
            finished = self._finished(cursor, inserted)
            if finished:
                cursor.execute(self._ids("DELETE_IDS", len(finished)), sorted(finished))
            woken = [job_id for job_id in inserted if job_id not in finished]
            if woken and self._dialect is POSTGRES:
                cursor.execute(self._sql["NOTIFY"], (self._channel(), woken[0]))

    def _finished(self, cursor: Any, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        cursor.execute(self._ids("FINISHED_IDS", len(ids)), list(ids))
        return {str(row[0]) for row in cursor.fetchall()}

    # -- sizes ---------------------------------------------------------------------

    def _batches(
        self, cursor: Any, items: Sequence[tuple[Envelope, float]], params: Sequence[tuple[Any, ...]]
    ) -> list[list[tuple[Any, ...]]]:
        """``params`` cut into statements: at most 500 rows, and on MySQL under its packet limit."""
        if self._dialect is not MYSQL:
            return [list(params[i : i + ROWS_PER_STATEMENT]) for i in range(0, len(params), ROWS_PER_STATEMENT)]
        if self._packet_limit is None:
            cursor.execute(self._sql["MAX_ALLOWED_PACKET"])
            self._packet_limit = int(cursor.fetchone()[0])
        limit = self._packet_limit
        budget = limit - len(self._sql["INSERT_INTO"]) - PACKET_MARGIN
        row_text = len(self._sql["INSERT_ROW"]) + 2
        batches: list[list[tuple[Any, ...]]] = []
        batch: list[tuple[Any, ...]] = []
        size = 0
        for (envelope, _), row in zip(items, params, strict=True):
            row_size = row_text + sum(_bound(value) for value in row)
            if row_size > budget:
                row_size = row_text + sum(_escaped(value) for value in row)
                if row_size > budget:
                    raise QueueError(
                        f"job {envelope.name!r} ({envelope.id}) is too large for the MySQL server: its row takes "
                        f"{row_size} bytes in an INSERT, over the server's max_allowed_packet of {limit} bytes; "
                        "keep large data elsewhere and pass a reference to it, or raise max_allowed_packet"
                    )
            if batch and (size + row_size > budget or len(batch) == ROWS_PER_STATEMENT):
                batches.append(batch)
                batch, size = [], 0
            batch.append(row)
            size += row_size
        if batch:
            batches.append(batch)
        return batches

    # -- what the completer writes -------------------------------------------

    def record_finished(self, cursor: Any, ids: Sequence[str]) -> None:
        """Tombstones for finished jobs, written with the deletes of their rows."""
        for start in range(0, len(ids), ROWS_PER_STATEMENT):
            chunk = ids[start : start + ROWS_PER_STATEMENT]
            conflict = self._sql["FINISHED_ON_CONFLICT_MYSQL" if self._dialect is MYSQL else "FINISHED_ON_CONFLICT"]
            rows = ", ".join([self._sql["FINISHED_ROW"]] * len(chunk))
            cursor.execute(f"{self._sql['FINISHED_INTO']} {rows}{conflict}", list(chunk))


def _bound(value: Any) -> int:
    """At least the bytes ``value`` takes in a statement, cheaply: 4 per character covers UTF-8 and escapes."""
    return 4 * len(value) + 2 if isinstance(value, str) else 32


def _escaped(value: Any) -> int:
    """The bytes PyMySQL sends for ``value``."""
    if not isinstance(value, str):
        return 32
    # Only MySQL gets here, with its driver loaded.
    escaped: str = importlib.import_module("pymysql.converters").escape_string(value)
    return len(escaped.encode("utf-8", "surrogatepass")) + 2
