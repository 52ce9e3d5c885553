"""The claim's query plan does not depend on the planner's statistics (PostgreSQL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from syncjobs.database import queries
from syncjobs.database.dialects import POSTGRES, SQLITE, dialect_for
from tests.test_database import drop_tables, execute, install_tables


@pytest.fixture
def unanalyzed_backlog(server_url: str) -> Iterator[str]:
    """A queue table of 130,000 ready rows, vacuumed but never analyzed: row counts, no column statistics."""
    table = f"plan_{uuid.uuid4().hex[:10]}"
    install_tables(server_url, table)
    try:
        execute(
            server_url,
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "SELECT 'job-' || g, 'default', 'tests.probe', '{}', 'queued', 0, 3, "
            "extract(epoch from now()) - 60 + g * 0.001, extract(epoch from now()) FROM generate_series(1, 130000) g",
        )
        execute(server_url, f"VACUUM {table}")
        assert execute(server_url, "SELECT COUNT(*) FROM pg_stats WHERE tablename = %s", (table,)) == [(0,)]
        yield table
    finally:
        drop_tables(server_url, table)


def _plan(url: str, template: str, table: str, params: tuple[object, ...]) -> str:
    rows = execute(url, "EXPLAIN " + POSTGRES.sql(template, table), params)
    return "\n".join(str(row[0]) for row in rows)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server_url", ["postgresql"], indirect=True)
def test_the_claim_is_an_ordered_index_scan_without_column_statistics(server_url: str, unanalyzed_backlog: str) -> None:
    # Without statistics the planner guesses a handful of ready rows; a claim
    # whose clock were a per-row filter would then sort every queued row.
    table = unanalyzed_backlog
    # From the start (every priority), and from a floor (one priority, from a due time on).
    start, floor = ("default", 10), ("default", 0, 0.0, 10)
    lease = ("claimed", "owner", "token", 30.0)
    plans = {
        "CLAIM_RETURNING": _plan(server_url, queries.CLAIM_RETURNING, table, (*lease, *start)),
        "CLAIM_RETURNING_FLOOR": _plan(server_url, queries.CLAIM_RETURNING_FLOOR, table, (*lease, *floor)),
        "MARK_AND_CLAIM": _plan(server_url, queries.MARK_AND_CLAIM, table, (["job-1"], ["token"], *lease, *start)),
        "MARK_AND_CLAIM_FLOOR": _plan(
            server_url, queries.MARK_AND_CLAIM_FLOOR, table, (["job-1"], ["token"], *lease, *floor)
        ),
        "SELECT_READY": _plan(server_url, queries.SELECT_READY, table, start),
        "SELECT_READY_FLOOR": _plan(server_url, queries.SELECT_READY_FLOOR, table, floor),
    }
    for name, plan in plans.items():
        assert f"Index Scan using {table}_ready" in plan, f"{name}:\n{plan}"
        for node in ("Sort", "Bitmap", "Seq Scan"):
            assert node not in plan, f"{name}:\n{plan}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("db_url", ["sqlite", "mysql"], indirect=True)
def test_the_claim_reads_the_claim_index_in_its_order_on_sqlite_and_mysql(db_url: str) -> None:
    # SQLite's planner, without ANALYZE, would take the due-time index for "run_at <= now" and sort
    # every ready row; MySQL's may, on stale statistics. Both are told which index to read.
    dialect = dialect_for(db_url)
    table = f"plan_{uuid.uuid4().hex[:10]}"
    install_tables(db_url, table)
    try:
        insert = (
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, priority, run_at, "
            "created_at) VALUES (?, 'default', 'tests.probe', '{}', 'queued', 0, 3, ?, ?, 1)"
        )
        for n in range(200):
            execute(db_url, insert, (f"job-{n}", n % 5, float(n)))
        explain = "EXPLAIN QUERY PLAN " if dialect is SQLITE else "EXPLAIN "
        lease = ("claimed", "owner", "token", 30.0)
        claims = {"SELECT_READY": ("default", 10), "SELECT_READY_FLOOR": ("default", 0, 5.0, 10)}
        if dialect is SQLITE:
            claims |= {
                "CLAIM_RETURNING": (*lease, "default", 10),
                "CLAIM_RETURNING_FLOOR": (*lease, "default", 0, 5.0, 10),
            }
        for name, params in claims.items():
            sql = dialect.sql(getattr(queries, name), table).replace(dialect.placeholder, "?")
            plan = "\n".join(" ".join(map(str, row)) for row in execute(db_url, explain + sql, params))
            assert f"{table}_ready" in plan, f"{name}:\n{plan}"
            for sort in ("TEMP B-TREE", "filesort"):
                assert sort not in plan, f"{name}:\n{plan}"
    finally:
        drop_tables(db_url, table)
