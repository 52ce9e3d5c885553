"""What every database dialect provides: its SQL fragments, its driver, and what its errors mean.

Queries are written once (see ``queries.py``) with ``?`` placeholders and
``{table}``, ``{now}`` and ``{lock}`` slots that each dialect fills in. Only
identifiers syncjobs validated itself ever reach SQL text; every value is a
bound parameter.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult

from ..errors import QueueError

# fullmatch, not match with "$": "$" also matches before a trailing newline.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_identifier(value: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise QueueError(
            f"{what} {value!r} is not a valid name: use letters, digits and underscores, "
            "starting with a letter or underscore, at most 63 characters"
        )
    return value


#: The longest jobs table name: its companions add up to 10 characters
#: (``_schedules``), and MySQL stops at 64 (PostgreSQL cuts names at 63, the
#: same way wherever they are written).
MAX_TABLE_NAME = 54


def check_table(table: str, dialect: Dialect | None = None) -> str:
    """``table``, if it is a valid name that leaves room for its companions' (on ``dialect``, if given)."""
    check_identifier(table, "table")
    longest = MAX_TABLE_NAME if dialect is None else dialect.max_table
    if len(table) > longest:
        where = "every database's limit" if dialect is None else f"{dialect.name}'s limit"
        raise QueueError(
            f"table {table!r} is too long: at most {longest} characters, so that the names of its companion "
            f"tables and indexes ({table}_schedules and the others) fit {where}"
        )
    return table


#: Every connection syncjobs opens gives up connecting after this long.
CONNECT_TIMEOUT = 5.0
#: The longest one statement of syncjobs' may run, where the server can enforce it.
STATEMENT_TIMEOUT = 30.0
#: The longest one statement waits for another transaction's row or table lock.
LOCK_TIMEOUT = 10.0

#: ``(abort, close)`` for one connection: ``abort()`` unblocks, from any thread,
#: whatever the connection waits for; ``close()`` closes it and what abort holds.
AbortHandles = tuple[Callable[[], None], Callable[[], None]]


def socket_handles(conn: Any, fileno: int) -> AbortHandles:
    """Abort by shutting the connection's socket down: its reader sees the end of the stream at once.

    The socket is held through a duplicate of its descriptor, so that the
    abort can never reach another socket that reused a closed descriptor's number.
    """
    sock = socket.socket(fileno=os.dup(fileno))

    def abort() -> None:
        sock.shutdown(socket.SHUT_RDWR)

    def close() -> None:
        try:
            conn.close()
        finally:
            sock.close()

    return abort, close


@dataclass(frozen=True)
class Dialect:
    name: str
    #: URL schemes that select this dialect.
    schemes: tuple[str, ...]
    #: SQL for the database clock, as seconds since the epoch (a float).
    now: str
    #: Appended to the claim's SELECT: row locks that other workers skip.
    lock: str
    #: How a claim's transaction begins.
    begin: str
    #: The driver's placeholder.
    placeholder: str
    #: Column types for keys and times.
    text_key: str
    real: str
    #: The DB-API driver's module name and the extra that installs it.
    driver: str
    extra: str | None
    #: ``connect(driver, url, parts, connect_args)``: a new connection in
    #: autocommit mode (the store opens transactions itself); the driver's
    #: keyword arguments in ``connect_args`` override what the URL says.
    connect: Callable[[Any, str, SplitResult, Mapping[str, Any]], Any]
    #: ``is_contention(driver, exc)``: two transactions in each other's way;
    #: try again on the same connection.
    is_contention: Callable[[Any, BaseException], bool]
    #: ``is_connection_error(driver, exc)``: a lost or refused connection;
    #: reconnect and try again.
    is_connection_error: Callable[[Any, BaseException], bool]
    #: ``abort_handles(connection)``: how to abort and close a new connection.
    abort_handles: Callable[[Any], AbortHandles]
    #: UPDATE … RETURNING: a claim in one statement.
    returning: bool = False
    #: Run on the connections of the store's own loops (claims, completions,
    #: renewals): commits that need not wait for the server's disk.
    relaxed_session: str | None = None
    #: Run on the other connections: those of the threads that call the queue (dispatch, status).
    caller_session: str | None = None
    #: Run on each connection the store opens where the driver's own wait for
    #: a lock sleeps too long (SQLite's busy handler sleeps 1 ms, then 2, then
    #: 5, where a write lock is held for a tenth of that): a locked database
    #: then fails at once, and the operation is tried again in steps from
    #: :data:`~.connections.LOCK_STEPS` until its attempt's end.
    no_lock_wait: str | None = None
    #: ``now`` read once per statement, for WHERE clauses, where a volatile
    #: clock would be a filter run on every row rather than an index
    #: condition (``None``: ``now`` already is).
    now_once: str | None = None
    #: The top-level modules of DB-API drivers whose connections reach this
    #: database (a caller's ``connection=`` may come from another than ours).
    drivers: tuple[str, ...] = ()
    #: After the claim's table: what makes it read the claim index, whatever
    #: the planner's statistics say (``{ready_index}`` in the queries).
    ready_index: str = ""
    #: The longest jobs table name: where the database refuses a longer companion's (or index's) name.
    max_table: int = MAX_TABLE_NAME

    def sql(self, template: str, table: str) -> str:
        text = (
            template.replace("{ready_index}", self.ready_index)
            .replace("{table}", table)
            .replace("{now_once}", self.now_once or self.now)
        )
        text = text.replace("{now}", self.now).replace("{lock}", self.lock)
        return text.replace("?", self.placeholder) if self.placeholder != "?" else text

    def load_driver(self) -> Any:
        try:
            return importlib.import_module(self.driver)
        except ImportError as exc:
            raise QueueError(
                f"the {self.name} backend needs the {self.driver} driver: install syncjobs' {self.extra!r} extra "
                f"(from a checkout, pip install '.[{self.extra}]')"
            ) from exc
