"""The three dialects by URL scheme, and the connector that opens connections for one URL."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ..errors import QueueError
from .dialect import Dialect, check_identifier, check_table
from .mysql import MYSQL
from .postgres import POSTGRES
from .sqlite import SQLITE

__all__ = ["MYSQL", "POSTGRES", "SQLITE", "Connector", "Dialect", "check_identifier", "check_table", "dialect_for"]

_BY_SCHEME = {scheme: dialect for dialect in (SQLITE, POSTGRES, MYSQL) for scheme in dialect.schemes}


def dialect_for(url: str) -> Dialect:
    scheme = urlsplit(url).scheme if isinstance(url, str) else ""
    try:
        return _BY_SCHEME[scheme]
    except KeyError:
        raise QueueError(
            f"no database backend for the URL {url!r}: use sqlite:///path, postgresql://… or mysql://…"
        ) from None


class Connector:
    """Opens DB-API connections for one URL (autocommit), and tells its errors apart."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = dialect_for(url)
        self.driver = self.dialect.load_driver()
        self._parts = urlsplit(url)

    def connect(self) -> Any:
        return self.dialect.connect(self.driver, self.url, self._parts)

    def is_transient(self, exc: BaseException) -> bool:
        """Worth trying again: a lost connection, or contention (deadlock, lock timeout, SQLite busy)."""
        return self.is_contention(exc) or self.is_connection_error(exc)

    def is_contention(self, exc: BaseException) -> bool:
        return self.dialect.is_contention(self.driver, exc)

    def is_connection_error(self, exc: BaseException) -> bool:
        return self.dialect.is_connection_error(self.driver, exc)
