"""MySQL 8+ and MariaDB 10.6+ through PyMySQL: SKIP LOCKED claims in a short transaction."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote

from .dialect import CONNECT_TIMEOUT, LOCK_TIMEOUT, STATEMENT_TIMEOUT, AbortHandles, Dialect, socket_handles

# Server errors that mean "try again": 1213 deadlock, 1205 lock wait timeout.
_CONTENTION = (1213, 1205)


def _connect(driver: Any, url: str, parts: SplitResult, connect_args: Mapping[str, Any]) -> Any:
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    from_url = {
        "host": parts.hostname or "localhost",
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
        "database": unquote(parts.path.lstrip("/")) or None,
        "charset": options.get("charset", "utf8mb4"),
        "connect_timeout": float(options.get("connect_timeout", CONNECT_TIMEOUT)),
        # Without these a read on a silently dead path waits forever, and so
        # does close() behind it.
        "read_timeout": float(options.get("read_timeout", STATEMENT_TIMEOUT)),
        "write_timeout": float(options.get("write_timeout", STATEMENT_TIMEOUT)),
    }
    conn = driver.connect(**{**from_url, **connect_args, "autocommit": True})
    try:
        with conn.cursor() as cursor:
            # The clock in UTC: in a zone with daylight saving, NOW() repeats an
            # hour each autumn and UNIX_TIMESTAMP() of it jumps by an hour.
            # Run after any init_command of the caller's, so that it holds.
            cursor.execute(f"SET time_zone = '+00:00', innodb_lock_wait_timeout = {int(LOCK_TIMEOUT)}")
    except BaseException:
        conn.close()
        raise
    return conn


def _abort_handles(conn: Any) -> AbortHandles:
    # PyMySQL has no public accessor for its socket.
    return socket_handles(conn, conn._sock.fileno())


def _errors(driver: Any) -> Any:
    """The driver's exception module, the one its connections raise from.

    Not ``driver.err`` as such: where PyMySQL stands in for MySQLdb
    (``pymysql.install_as_MySQLdb()``, as Django projects do), Django's MySQL
    backend imports ``MySQLdb.converters``, which loads a second copy of
    ``pymysql/err.py`` as ``MySQLdb.err`` and rebinds ``pymysql.err`` to it;
    PyMySQL's connections still raise the first copy's classes.
    """
    return sys.modules.get(f"{driver.__name__}.err") or driver.err


def _is_contention(driver: Any, exc: BaseException) -> bool:
    return isinstance(exc, _errors(driver).OperationalError) and bool(exc.args) and exc.args[0] in _CONTENTION


def _is_connection_error(driver: Any, exc: BaseException) -> bool:
    errors = _errors(driver)
    return not _is_contention(driver, exc) and isinstance(exc, (errors.OperationalError, errors.InterfaceError))


MYSQL = Dialect(
    name="mysql",
    schemes=("mysql", "mariadb", "mysql+pymysql"),
    now="UNIX_TIMESTAMP(NOW(6))",
    lock=" FOR UPDATE SKIP LOCKED",
    # Statistics gone stale (a bulk load) may make the due-time index and a filesort look cheaper.
    ready_index=" FORCE INDEX ({table}_ready)",
    # An index name stops at 64 characters too: "<table>_results_expires" is the longest.
    max_table=48,
    begin="BEGIN",
    placeholder="%s",
    text_key="VARCHAR(64)",
    real="DOUBLE",
    driver="pymysql",
    extra="mysql",
    connect=_connect,
    is_contention=_is_contention,
    is_connection_error=_is_connection_error,
    abort_handles=_abort_handles,
    drivers=("pymysql", "MySQLdb", "mysql", "mariadb"),
)
