"""The claim's query plan does not depend on the planner's statistics (PostgreSQL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from syncjobs.database import queries
from syncjobs.database.claim_floor import FROM_START
from syncjobs.database.dialects import POSTGRES
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
    claim = ("claimed", "owner", "token", 30.0, "default", FROM_START, 10)
    plans = {
        "CLAIM_RETURNING": _plan(server_url, queries.CLAIM_RETURNING, table, claim),
        "MARK_AND_CLAIM": _plan(server_url, queries.MARK_AND_CLAIM, table, (["job-1"], ["token"], *claim)),
        "SELECT_READY": _plan(server_url, queries.SELECT_READY, table, ("default", FROM_START, 10)),
    }
    for name, plan in plans.items():
        assert f"Index Scan using {table}_claim" in plan, f"{name}:\n{plan}"
        for node in ("Sort", "Bitmap", "Seq Scan"):
            assert node not in plan, f"{name}:\n{plan}"
