"""PostgreSQL through psycopg 3: SKIP LOCKED claims, UPDATE … RETURNING, LISTEN/NOTIFY."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult

from .dialect import CONNECT_TIMEOUT, LOCK_TIMEOUT, STATEMENT_TIMEOUT, AbortHandles, Dialect, socket_handles

# libpq's own defaults never notice a silently dead peer (no keepalives for
# two hours, unacknowledged data retransmitted for 15 minutes): these do, in
# under 30 s, also on a connection that only waits (LISTEN). A URL's own
# values win.
_NETWORK_DEFAULTS = {
    "connect_timeout": str(int(CONNECT_TIMEOUT)),
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": str(int(STATEMENT_TIMEOUT * 1000)),
}

# Server-side bounds for syncjobs' own sessions; a URL's own options come after, so they win.
_SESSION_OPTIONS = (
    f"-c statement_timeout={int(STATEMENT_TIMEOUT * 1000)} -c lock_timeout={int(LOCK_TIMEOUT * 1000)} "
    # A transaction left open by a client that vanished releases its row locks.
    f"-c idle_in_transaction_session_timeout={int(STATEMENT_TIMEOUT * 1000)}"
)


def _connect(driver: Any, url: str, parts: SplitResult, connect_args: Mapping[str, Any]) -> Any:
    # psycopg takes the URL as it is, and keyword arguments over it (Django's
    # own connection parameters); autocommit, so each statement stands alone
    # unless the store opens a transaction.
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    given = {**driver.conninfo.conninfo_to_dict(conninfo), **connect_args}
    params: dict[str, Any] = {key: value for key, value in _NETWORK_DEFAULTS.items() if key not in given}
    params.update(connect_args)
    params["options"] = f"{_SESSION_OPTIONS} {given.get('options') or ''}".strip()
    return driver.connect(conninfo, **{**params, "autocommit": True})


def _abort_handles(conn: Any) -> AbortHandles:
    return socket_handles(conn, conn.fileno())


def notify_channel(table: str, queue: str) -> str:
    """The LISTEN/NOTIFY channel of a queue: 41 characters whatever the table and queue.

    A hash, so that it fits PostgreSQL's 63-byte identifiers with any table
    name, and nothing a caller chose reaches SQL text.
    """
    digest = hashlib.sha256(f"{table}\0{queue}".encode()).hexdigest()[:32]
    return f"syncjobs_{digest}"


# Contention, by SQLSTATE rather than by exception class: psycopg 3.3's
# DeadlockDetected and SerializationFailure derive from OperationalError, not
# TransactionRollback, and would pass for a lost connection. Class 40 is a
# rolled-back transaction (serialization failure, deadlock) but for 40003,
# whose statement's outcome is unknown; 55P03 is a lock not available.
_CONTENTION_SQLSTATES = frozenset({"40000", "40001", "40002", "40P01", "55P03"})


def _is_contention(driver: Any, exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None)
    return sqlstate in _CONTENTION_SQLSTATES


def _is_connection_error(driver: Any, exc: BaseException) -> bool:
    return not _is_contention(driver, exc) and isinstance(exc, (driver.OperationalError, driver.InterfaceError))


POSTGRES = Dialect(
    name="postgresql",
    schemes=("postgresql", "postgres", "postgresql+psycopg"),
    now="extract(epoch from clock_timestamp())::double precision",
    # clock_timestamp() is volatile: in a WHERE clause it is a filter on every
    # row, and the claim's "run_at <= now" is no index condition. Without
    # column statistics (a VACUUM with no ANALYZE) the planner then guesses 3
    # ready rows and sorts all of them (90 ms at 130k rows). As an InitPlan
    # it is read once and bounds the ordered index scan.
    now_once="(SELECT extract(epoch from clock_timestamp())::double precision)",
    lock=" FOR UPDATE SKIP LOCKED",
    begin="BEGIN",
    placeholder="%s",
    text_key="VARCHAR(64)",
    real="DOUBLE PRECISION",
    driver="psycopg",
    extra="postgres",
    connect=_connect,
    is_contention=_is_contention,
    is_connection_error=_is_connection_error,
    abort_handles=_abort_handles,
    returning=True,
    # Claims and completions only: if the server crashes before these commits
    # reach disk, the jobs run again (at-least-once). Dispatch stays durable.
    relaxed_session="SET synchronous_commit TO off",
    drivers=("psycopg", "psycopg2", "pg8000"),
)
