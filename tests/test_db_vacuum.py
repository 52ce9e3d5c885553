"""PostgreSQL vacuums a queue table after 1,000 dead tuples, and ``migrate`` says so of a populated one."""

from __future__ import annotations

import uuid

import pytest

import syncjobs
from syncjobs.database.schema import SCHEMA_VERSION
from tests.helpers import WAIT, Probe, ProbeJob
from tests.test_database import drop_tables, execute, install_tables

SETTINGS = ["autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=1000"]


def _reloptions(url: str, table: str) -> list[str]:
    rows = execute(url, "SELECT reloptions FROM pg_class WHERE relname = %s", (table,))
    return sorted(rows[0][0] or [])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server_url", ["postgresql"], indirect=True)
def test_migrate_sets_the_autovacuum_thresholds_of_a_populated_table_and_keeps_its_jobs(
    server_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    table = f"vac_{uuid.uuid4().hex[:10]}"
    try:
        install_tables(server_url, table)
        assert _reloptions(server_url, table) == SETTINGS  # a new table has them
        # A table made before them, with jobs in it.
        execute(server_url, f"ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold)")
        assert _reloptions(server_url, table) == []
        queue = syncjobs.DatabaseJobQueue(server_url, table=table, auto_schema=False, workers=1, poll_interval=0.2)
        queues.append(queue)
        queue.register(ProbeJob)
        probe = Probe()
        ids = [str(queue.dispatch(ProbeJob(probe=probe.id))) for _ in range(3)]
        assert queue.admin.migrate() == SCHEMA_VERSION
        assert _reloptions(server_url, table) == SETTINGS
        assert sorted(job_id for (job_id,) in execute(server_url, f"SELECT id FROM {table}")) == sorted(ids)
        queue.start()
        assert queue.join(WAIT)
        assert sorted(run["id"] for run in probe.runs) == sorted(ids)
    finally:
        drop_tables(server_url, table)
