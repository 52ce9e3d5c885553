"""A worker's claim in progress never holds up a dispatch (MySQL: no gap lock where new rows go)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from syncjobs.database import queries
from syncjobs.database.claim_floor import LOWEST_DOUBLE
from syncjobs.database.dialects import MYSQL, Connector
from tests.test_database import drop_tables, execute, install_tables

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def backlog(server_url: str) -> Iterator[str]:
    """Five ready rows (gap locks are InnoDB's: PostgreSQL locks the rows a claim reads; SQLite has one writer)."""
    table = f"locks_{uuid.uuid4().hex[:10]}"
    install_tables(server_url, table)
    for i in range(5):
        execute(
            server_url,
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, 'default', 'tests.probe', '{}', 'queued', 0, 3, ?, 1.0)",
            (f"job-{i}", 1000.0 + i),
        )
    yield table
    drop_tables(server_url, table)


def _dispatch_waits(url: str, table: str, session: str | None) -> bool:
    """Whether an INSERT of a new ready row waits while a claim, in a session set up by ``session``, is open."""
    connector = Connector(url)
    claimer, dispatcher = connector.connect(), connector.connect()
    try:
        claim: Any = claimer.cursor()
        if session:
            claim.execute(session)
        claim.execute("BEGIN")
        # A claim that reads to the end of the ready rows, as claims do when the workers keep up.
        claim.execute(MYSQL.sql(queries.SELECT_READY, table), ("default", LOWEST_DOUBLE, 10))
        assert [row[0] for row in claim.fetchall()][:5] == [f"job-{i}" for i in range(5)]
        insert: Any = dispatcher.cursor()
        insert.execute("SET innodb_lock_wait_timeout = 1")
        try:
            insert.execute(
                f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
                "VALUES (%s, 'default', 'tests.probe', '{}', 'queued', 0, 3, " + MYSQL.now + ", 1.0)",
                (f"job-{uuid.uuid4().hex[:8]}",),
            )
        except connector.dialect.load_driver().err.OperationalError as exc:
            if exc.args[0] != 1205:  # ER_LOCK_WAIT_TIMEOUT
                raise
            return True
        finally:
            claim.execute("ROLLBACK")
        return False
    finally:
        claimer.close()
        dispatcher.close()


@pytest.mark.parametrize("server_url", ["mysql"], indirect=True)
def test_a_dispatch_goes_in_while_a_workers_claim_is_open(server_url: str, backlog: str) -> None:
    assert MYSQL.relaxed_session is not None
    assert not _dispatch_waits(server_url, backlog, MYSQL.relaxed_session)
    # The worker sessions' setting is what makes it so: under REPEATABLE READ it waited.
    assert _dispatch_waits(server_url, backlog, None)
