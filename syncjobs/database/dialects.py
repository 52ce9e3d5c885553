"""The three dialects by URL scheme, and the connector that opens connections for one URL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..errors import QueueError
from ..urls import mask_url
from .dialect import Dialect, check_identifier, check_table
from .mysql import MYSQL
from .postgres import POSTGRES
from .sqlite import SQLITE

__all__ = [
    "MYSQL",
    "POSTGRES",
    "SQLITE",
    "Connector",
    "Dialect",
    "check_connection",
    "check_identifier",
    "check_table",
    "dialect_for",
]

_BY_SCHEME = {scheme: dialect for dialect in (SQLITE, POSTGRES, MYSQL) for scheme in dialect.schemes}
_BY_DRIVER = {driver: dialect for dialect in (SQLITE, POSTGRES, MYSQL) for driver in dialect.drivers}


def dialect_for(url: str) -> Dialect:
    scheme = urlsplit(url).scheme if isinstance(url, str) else ""
    try:
        return _BY_SCHEME[scheme]
    except KeyError:
        shown = repr(mask_url(url)) if isinstance(url, str) else f"of type {type(url).__name__}"
        raise QueueError(
            f"no database backend for the URL {shown}: use sqlite:///path, postgresql://… or mysql://…"
        ) from None


def check_connection(dialect: Dialect, connection: object, job: str) -> None:
    """Refuse, before any SQL runs, a caller's ``connection=`` that cannot reach a ``dialect`` database.

    Known by its driver's module; a connection of a driver not listed
    anywhere (a pool's proxy, say) is taken at its word.
    """
    kind = type(connection)
    shown = f"{kind.__module__}.{kind.__qualname__}"
    expected = f"an open {' or '.join(dialect.drivers[:2])} connection to the {dialect.name} database"
    if not callable(getattr(connection, "cursor", None)):
        raise QueueError(f"job {job!r}: connection= must be {expected}, got a {shown}")
    other = _BY_DRIVER.get(kind.__module__.partition(".")[0])
    if other is not None and other is not dialect:
        raise QueueError(
            f"job {job!r}: connection= is a {shown}, which reaches a {other.name} database; "
            f"this queue's table is in {dialect.name}: it needs {expected}"
        )


class Connector:
    """Opens DB-API connections for one URL (autocommit), and tells its errors apart.

    ``connect_args``: the driver's own keyword arguments, over what the URL
    says (what a framework's database settings give, a Unix socket or TLS
    options, say, which no URL spells the same way for every driver).
    """

    def __init__(self, url: str, connect_args: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.dialect = dialect_for(url)
        self.driver = self.dialect.load_driver()
        self.connect_args: Mapping[str, Any] = dict(connect_args or {})
        self._parts = urlsplit(url)

    def __repr__(self) -> str:
        return f"Connector({mask_url(self.url)!r})"

    def connect(self) -> Any:
        return self.dialect.connect(self.driver, self.url, self._parts, self.connect_args)

    def is_transient(self, exc: BaseException) -> bool:
        """Worth trying again: a lost connection, or contention (deadlock, lock timeout, SQLite busy)."""
        return self.is_contention(exc) or self.is_connection_error(exc)

    def is_contention(self, exc: BaseException) -> bool:
        return self.dialect.is_contention(self.driver, exc)

    def is_connection_error(self, exc: BaseException) -> bool:
        return self.dialect.is_connection_error(self.driver, exc)
