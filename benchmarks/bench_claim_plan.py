"""The PostgreSQL claim on a backlog the planner has no column statistics for.

    python benchmarks/bench_claim_plan.py [--postgresql-url URL] [--rows 130000] [--claims 50]

A queue table of ``--rows`` ready rows is vacuumed but never analyzed (a bulk
load, autovacuum behind): the planner knows how many rows there are, not how
many are ready. Each claim (``UPDATE … WHERE id IN (SELECT … ORDER BY run_at
LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING``) runs in a transaction that is
rolled back, so every claim sees the same table. Shown: the plan's scan and
the median time of a claim, for the claim as it is and as it was with the
clock as a per-row filter (``clock_timestamp()`` in the WHERE clause).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import syncjobs
from syncjobs.database import queries
from syncjobs.database.dialect import Dialect
from syncjobs.database.dialects import POSTGRES, Connector
from syncjobs.database.schema import COMPANIONS

TABLE = "syncjobs_bench_plan"
# A claim of 10 rows read from the start (every priority, in the claim index's order).
CLAIM = ("claimed", "owner", "token", 30.0, "default", 10)


def fill(connector: Connector, rows: int) -> None:
    queue = syncjobs.DatabaseJobQueue(connector.url, table=TABLE, workers=0)
    try:
        queue.install_schema()
    finally:
        queue.shutdown()
    conn = connector.connect()
    try:
        cursor = conn.cursor()
        cursor.execute(f"TRUNCATE {TABLE}")
        cursor.execute(
            f"INSERT INTO {TABLE} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "  # noqa: S608
            "SELECT 'job-' || g, 'default', 'bench.noop', '{}', 'queued', 0, 3, "
            "extract(epoch from now()) - 600 + g * 0.001, extract(epoch from now()) FROM generate_series(1, %s) g",
            (rows,),
        )
        cursor.execute(f"VACUUM {TABLE}")
        # Statistics from an ANALYZE (by hand or autovacuum) would hide the cliff.
        cursor.execute("SELECT COUNT(*) FROM pg_stats WHERE tablename = %s", (TABLE,))
        if cursor.fetchone()[0]:
            raise SystemExit(f"{TABLE} has column statistics: is autovacuum analyzing it?")
    finally:
        conn.close()


def scan_of(cursor: Any, sql: str) -> str:
    cursor.execute("EXPLAIN " + sql, CLAIM)
    plan = [str(row[0]) for row in cursor.fetchall()]
    scans = [line.strip().lstrip("-> ").split("  (")[0] for line in plan if "Scan" in line or "Sort" in line]
    noise = ("_pkey", "Subquery Scan", "Sort Key")
    return "; ".join(scan for scan in scans if not any(word in scan for word in noise))


def claim_ms(cursor: Any, sql: str, claims: int, params: tuple[Any, ...] = CLAIM) -> float:
    """The median time of ``claims`` claims, each rolled back, milliseconds."""
    samples = []
    for _ in range(claims):
        cursor.execute("BEGIN")
        began = time.perf_counter()
        cursor.execute(sql, params)
        cursor.fetchall()
        samples.append(time.perf_counter() - began)
        cursor.execute("ROLLBACK")
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgresql-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rows", type=int, default=130_000)
    parser.add_argument("--claims", type=int, default=50)
    args = parser.parse_args()
    connector = Connector(args.postgresql_url)
    fill(connector, args.rows)
    before: Dialect = dataclasses.replace(POSTGRES, now_once=None)
    conn = connector.connect()
    try:
        cursor = conn.cursor()
        print(f"claim of 10 rows, {args.rows:,} ready rows, vacuumed and never analyzed, median of {args.claims}")
        for label, dialect in (("clock read per row (before)", before), ("clock read once (now)", POSTGRES)):
            sql = dialect.sql(queries.CLAIM_RETURNING, TABLE)
            print(f"  {label:<28} {claim_ms(cursor, sql, args.claims):>8.3f} ms   {scan_of(cursor, sql)}")
        print("  goal: under 1 ms, an index scan and no sort")
        for suffix in ("", *COMPANIONS):
            cursor.execute(f"DROP TABLE IF EXISTS {TABLE}{suffix}")
    finally:
        conn.close()


if __name__ == "__main__":
    main()
