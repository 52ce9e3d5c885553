"""The web dashboard: a jobs table's or an in-memory queue's jobs, workers and schedules; retry, cancel, purge.

``syncjobs web --url …`` serves a database's; :func:`dashboard` makes it a WSGI
app to mount under a Flask app or a Django project (``syncjobs.contrib.django``'s
``dashboard_view`` guards it with Django's staff login). On a database URL or
queue it shows the jobs table (every queue in it, :func:`table_board`); on an
:class:`~syncjobs.InMemoryJobQueue` it shows that queue, and must be mounted in
the process that runs it (:func:`memory_board`). It is never open by default:
a token, a user and password, or the mounting app's own check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..database.admin import TableAdmin
from ..database.dialects import Connector
from ..database.queue import DatabaseJobQueue
from ..database.schema import SCHEMA_VERSION
from ..errors import QueueError
from ..memory import InMemoryJobQueue
from ..urls import mask_url
from .access import Access, Environ
from .app import Dashboard
from .board import Board, Overview, TableBoard
from .memory_board import MemoryBoard

__all__ = [
    "Access",
    "Board",
    "Dashboard",
    "MemoryBoard",
    "Overview",
    "TableBoard",
    "board_on",
    "dashboard",
    "memory_board",
    "queue_board",
    "table_board",
]

DEFAULT_TABLE = "syncjobs_jobs"


def table_board(
    source: str | DatabaseJobQueue, *, table: str | None = None, connect_args: Mapping[str, Any] | None = None
) -> TableBoard:
    """A board on ``source``'s jobs table (a database URL, or a database queue: its URL and table), every queue in it.

    On connections of its own; :meth:`TableBoard.close` closes them.
    """
    if isinstance(source, DatabaseJobQueue):
        url, table, connect_args = source.url, table or source.table, connect_args or source.connect_args
    elif isinstance(source, str):
        url, table = source, table or DEFAULT_TABLE
    else:
        raise QueueError(
            "table_board() shows a database's jobs table: give a database URL or a DatabaseJobQueue, not "
            f"{type(source).__name__}"
            + (
                " (an in-memory queue's jobs are inside its process: memory_board(queue) or dashboard(queue) "
                "shows them there)"
                if isinstance(source, InMemoryJobQueue)
                else ""
            )
        )
    admin = TableAdmin.connect(url, table=table, connect_args=connect_args)
    return board_on(admin, url, connect_args, "run `syncjobs migrate` (or install_schema() on its queue)")


def board_on(admin: TableAdmin, url: str, connect_args: Mapping[str, Any] | None, upgrade: str) -> TableBoard:
    """A board on ``admin``'s table; a :class:`QueueError` (``admin`` closed) unless it is at this version.

    ``upgrade`` says how to bring an older table to this version.
    """
    try:
        found = admin.schema_version()
    except BaseException:
        admin.close()
        raise
    if found != SCHEMA_VERSION:
        admin.close()
        where = "there is no such table" if found is None else f"it is at schema version {found}"
        how = "upgrade syncjobs to a version that reads it" if found is not None and found > SCHEMA_VERSION else upgrade
        raise QueueError(
            f"the dashboard of table {admin.table!r} needs schema version {SCHEMA_VERSION} and {where}: {how}"
        )
    return TableBoard(admin, describe(url, admin.table, connect_args))


def queue_board(queue: DatabaseJobQueue | InMemoryJobQueue) -> Board:
    """A board on ``queue``'s jobs: a database queue's table (every queue in it) on the queue's own connections
    (closed with the queue, never by the board), or an in-memory queue (see :func:`memory_board`)."""
    if isinstance(queue, InMemoryJobQueue):
        return memory_board(queue)
    if not isinstance(queue, DatabaseJobQueue):
        raise QueueError(f"queue_board() shows a DatabaseJobQueue or an InMemoryJobQueue, not {type(queue).__name__}")
    return TableBoard(queue.admin, describe(queue.url, queue.table, queue.connect_args), owned=False)


def describe(url: str, table: str, connect_args: Mapping[str, Any] | None = None) -> str:
    """What a dashboard of a table says it shows: the database's URL with the password masked, the table."""
    Connector(url, connect_args)  # a URL no backend takes is refused here, as everywhere
    return f"{mask_url(url)} · table {table}"


def memory_board(queue: InMemoryJobQueue) -> MemoryBoard:
    """A board on ``queue``, an in-memory queue of this process: the dashboard is mounted where its jobs are.

    It counts the jobs done from now on (see :class:`MemoryBoard`); nothing to close.
    """
    if not isinstance(queue, InMemoryJobQueue):
        raise QueueError(f"memory_board() shows an InMemoryJobQueue, not {type(queue).__name__}")
    return MemoryBoard(queue)


def dashboard(
    source: str | DatabaseJobQueue | InMemoryJobQueue,
    *,
    table: str | None = None,
    token: str | None = None,
    user: str | None = None,
    password: str | None = None,
    authorize: Callable[[Environ], bool] | None = None,
    open: bool = False,
    refresh_seconds: float = 2.0,
) -> Dashboard:
    """The dashboard of ``source`` as a WSGI app, guarded by exactly one of the ways :class:`Access` takes.

    ``source`` is a database URL or a ``DatabaseJobQueue`` (the jobs table,
    every queue in it; ``table`` names another table than the queue's or the
    default), or an ``InMemoryJobQueue`` of this process (that queue; no
    ``table``).

    ``authorize(environ) -> bool`` is for an app with its own login (the
    Django and Flask integrations mount it so: see their ``dashboard_view``
    and ``init_dashboard``); ``open=True`` only behind something that guards it.
    """
    access = Access(token=token, user=user, password=password, authorize=authorize, open=open)
    board: Board
    if isinstance(source, InMemoryJobQueue):
        if table is not None:
            raise QueueError("an in-memory queue has no table: give table= only with a database")
        board = memory_board(source)
    elif isinstance(source, (str, DatabaseJobQueue)):
        board = table_board(source, table=table)
    else:
        raise QueueError(
            "the dashboard shows a database's jobs table or an in-memory queue of this process: give a database "
            f"URL, a DatabaseJobQueue or an InMemoryJobQueue, not {type(source).__name__}"
        )
    return Dashboard(board, access, refresh_seconds=refresh_seconds)
