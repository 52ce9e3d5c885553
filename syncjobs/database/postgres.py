"""PostgreSQL through psycopg 3: SKIP LOCKED claims, UPDATE … RETURNING, LISTEN/NOTIFY."""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult

from .dialect import Dialect


def _connect(driver: Any, url: str, parts: SplitResult) -> Any:
    # psycopg takes the URL as it is; autocommit, so each statement stands
    # alone unless the store opens a transaction.
    return driver.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def _is_contention(driver: Any, exc: BaseException) -> bool:
    errors = driver.errors
    return isinstance(exc, (errors.TransactionRollback, errors.LockNotAvailable))


def _is_connection_error(driver: Any, exc: BaseException) -> bool:
    return not _is_contention(driver, exc) and isinstance(exc, (driver.OperationalError, driver.InterfaceError))


POSTGRES = Dialect(
    name="postgresql",
    schemes=("postgresql", "postgres", "postgresql+psycopg"),
    now="extract(epoch from clock_timestamp())::double precision",
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
    returning=True,
)
