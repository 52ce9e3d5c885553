"""What every database dialect provides: its SQL fragments, its driver, and what its errors mean.

Queries are written once (see ``queries.py``) with ``?`` placeholders and
``{table}``, ``{now}`` and ``{lock}`` slots that each dialect fills in. Only
identifiers syncjobs validated itself ever reach SQL text; every value is a
bound parameter.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult

from ..errors import QueueError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def check_identifier(value: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise QueueError(
            f"{what} {value!r} is not a valid name: use letters, digits and underscores, "
            "starting with a letter or underscore, at most 63 characters"
        )
    return value


#: The longest jobs table name: its companions add up to 8 characters
#: (``_workers``), and MySQL stops at 64, PostgreSQL at 63.
MAX_TABLE_NAME = 55


def check_table(table: str) -> str:
    check_identifier(table, "table")
    if len(table) > MAX_TABLE_NAME:
        raise QueueError(
            f"table {table!r} is too long: at most {MAX_TABLE_NAME} characters, so that its companion "
            f"tables ({table}_workers and the others) fit every database's limit"
        )
    return table


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
    #: ``connect(driver, url, parts)``: a new connection in autocommit mode
    #: (the store opens transactions itself).
    connect: Callable[[Any, str, SplitResult], Any]
    #: ``is_contention(driver, exc)``: two transactions in each other's way;
    #: try again on the same connection.
    is_contention: Callable[[Any, BaseException], bool]
    #: ``is_connection_error(driver, exc)``: a lost or refused connection;
    #: reconnect and try again.
    is_connection_error: Callable[[Any, BaseException], bool]
    #: UPDATE … RETURNING: a claim in one statement.
    returning: bool = False

    def sql(self, template: str, table: str) -> str:
        text = template.replace("{table}", table).replace("{now}", self.now).replace("{lock}", self.lock)
        return text.replace("?", self.placeholder) if self.placeholder != "?" else text

    def load_driver(self) -> Any:
        try:
            return importlib.import_module(self.driver)
        except ImportError as exc:
            raise QueueError(
                f"the {self.name} backend needs the {self.driver} driver: pip install 'syncjobs[{self.extra}]'"
            ) from exc
