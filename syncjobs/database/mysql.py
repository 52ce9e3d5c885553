"""MySQL 8+ and MariaDB 10.6+ through PyMySQL: SKIP LOCKED claims in a short transaction."""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote

from .dialect import Dialect

# Server errors that mean "try again": 1213 deadlock, 1205 lock wait timeout.
_CONTENTION = (1213, 1205)


def _connect(driver: Any, url: str, parts: SplitResult) -> Any:
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return driver.connect(
        host=parts.hostname or "localhost",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=unquote(parts.path.lstrip("/")) or None,
        autocommit=True,
        charset=options.get("charset", "utf8mb4"),
        connect_timeout=int(options.get("connect_timeout", 5)),
    )


def _is_contention(driver: Any, exc: BaseException) -> bool:
    return isinstance(exc, driver.err.OperationalError) and bool(exc.args) and exc.args[0] in _CONTENTION


def _is_connection_error(driver: Any, exc: BaseException) -> bool:
    return not _is_contention(driver, exc) and isinstance(exc, (driver.err.OperationalError, driver.err.InterfaceError))


MYSQL = Dialect(
    name="mysql",
    schemes=("mysql", "mariadb", "mysql+pymysql"),
    now="UNIX_TIMESTAMP(NOW(6))",
    lock=" FOR UPDATE SKIP LOCKED",
    begin="BEGIN",
    placeholder="%s",
    text_key="VARCHAR(64)",
    real="DOUBLE",
    driver="pymysql",
    extra="mysql",
    connect=_connect,
    is_contention=_is_contention,
    is_connection_error=_is_connection_error,
)
