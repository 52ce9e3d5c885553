"""A claim reads the queue from past the rows it already took, and from the start often enough."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from syncjobs.database import queries
from syncjobs.database.claim_floor import ClaimFloor
from syncjobs.database.dialects import POSTGRES, Connector
from syncjobs.database.fetcher import Fetcher
from tests.helpers import FakeClock
from tests.test_database import drop_tables, execute, install_tables

T = TypeVar("T")
pytestmark = pytest.mark.timeout(120)

# -- the floor on its own ---------------------------------------------------------


def test_a_full_claim_raises_the_floor_to_the_last_place_it_took() -> None:
    floor = ClaimFloor(clock=FakeClock(), every=1.0)
    assert floor.start() is None  # from the start
    floor.claimed(None, [(0, 10.0), (0, 12.5), (0, 11.0)], wanted=3)
    assert floor.start() == (0, 12.5)
    floor.claimed((0, 12.5), [(0, 13.0), (0, 14.0)], wanted=2)
    assert floor.start() == (0, 14.0)


def test_the_floor_is_in_the_claims_order_the_lowest_priority_taken_then_its_latest_due_time() -> None:
    floor = ClaimFloor(clock=FakeClock(), every=1.0)
    floor.claimed(None, [(5, 20.0), (5, 30.0), (0, 10.0), (0, 11.0)], wanted=4)
    assert floor.start() == (0, 11.0)  # the priority-5 rows are all taken: it reads on among the 0s


def test_a_claim_that_finds_fewer_rows_than_it_asked_for_sends_the_next_one_to_the_start() -> None:
    floor = ClaimFloor(clock=FakeClock(), every=60.0)
    floor.claimed(floor.start(), [(0, 10.0), (0, 11.0)], wanted=2)
    assert floor.start() == (0, 11.0)
    floor.claimed((0, 11.0), [(0, 12.0)], wanted=5)  # ready rows before (0, 11.0) would not have been seen
    assert floor.start() is None
    floor.claimed(None, [], wanted=5)  # an empty queue: still from the start
    assert floor.start() is None


def test_the_floor_holds_for_at_most_its_interval_after_a_read_from_the_start() -> None:
    clock = FakeClock()
    floor = ClaimFloor(clock=clock, every=0.25)
    floor.claimed(floor.start(), [(0, 10.0)], wanted=1)
    clock.advance(0.125)
    floor.claimed(floor.start(), [(0, 11.0)], wanted=1)  # full claims from the floor do not extend its time
    clock.advance(0.0625)
    assert floor.start() == (0, 11.0)
    clock.advance(0.0625)  # binary fractions: exactly 0.25 s after the read from the start
    assert floor.start() is None
    floor.claimed(None, [(0, 9.0)], wanted=1)  # a late row, below the old floor
    assert floor.start() == (0, 9.0)


# -- the floor in a claim, on each database ------------------------------------


class _Connection:
    """The fetcher's runner over one connection of the test's own."""

    def __init__(self, url: str) -> None:
        self.connector = Connector(url)
        self.conn = self.connector.connect()

    def run(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        return operation(self.conn.cursor())

    def transaction(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        cursor = self.conn.cursor()
        cursor.execute(self.connector.dialect.begin)
        try:
            result = operation(cursor)
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")
        return result


def fetcher_on(runner: _Connection, table: str, **options: Any) -> Fetcher:
    """A fetcher of the queue ``default`` in ``table``, through the test's own connection."""
    dialect = runner.connector.dialect
    return Fetcher(
        runner,
        {name: dialect.sql(text, table) for name, text in vars(queries).items() if name.isupper()},
        dialect,
        queue="default",
        owner="owner",
        lease=30.0,
        carry={},
        on_dead=lambda envelope, error: None,
        **options,
    )


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    name = f"floor_{uuid.uuid4().hex[:10]}"
    install_tables(db_url, name)
    yield name
    drop_tables(db_url, name)


def _insert_due(url: str, table: str, job_id: str, seconds_ago: float, priority: int = 0) -> None:
    execute(
        url,
        f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, priority, run_at, created_at) "
        "VALUES (?, 'default', 'tests.probe', '{}', 'queued', 0, 3, ?, ?, ?)",
        (job_id, priority, 1_000_000_000.0 - seconds_ago, 1.0),
    )


def test_a_row_that_comes_ready_below_the_floor_is_claimed_by_the_next_read_from_the_start(
    db_url: str, table: str
) -> None:
    for i in range(1, 5):
        _insert_due(db_url, table, f"job-{i}", 100 - i)  # due in dispatch order, job-1 first
    runner = _Connection(db_url)
    clock = FakeClock()
    fetcher = fetcher_on(runner, table, poll_interval=1.0, prefetch=0, floor=ClaimFloor(clock=clock, every=10.0))
    try:
        assert [e.id for e in fetcher.claim_batch(2)] == ["job-1", "job-2"]
        # A job whose dispatching transaction committed late: due before the floor.
        _insert_due(db_url, table, "job-late", 1000)
        assert [e.id for e in fetcher.claim_batch(1)] == ["job-3"]  # read from the floor, past it
        clock.advance(10.0)
        assert [e.id for e in fetcher.claim_batch(1)] == ["job-late"]  # read from the start
        assert [e.id for e in fetcher.claim_batch(5)] == ["job-4"]
    finally:
        runner.conn.close()


def test_a_job_of_a_higher_priority_dispatched_past_the_floor_is_claimed_by_the_next_read_from_the_start(
    db_url: str, table: str
) -> None:
    for i in range(1, 5):
        _insert_due(db_url, table, f"job-{i}", 100 - i)
    runner = _Connection(db_url)
    clock = FakeClock()
    fetcher = fetcher_on(runner, table, poll_interval=1.0, prefetch=0, floor=ClaimFloor(clock=clock, every=10.0))
    try:
        assert [e.id for e in fetcher.claim_batch(2)] == ["job-1", "job-2"]
        _insert_due(db_url, table, "job-urgent", 1, priority=10)  # due last, but first in the claim's order
        assert [e.id for e in fetcher.claim_batch(1)] == ["job-3"]  # read from the floor: priority 0 only
        clock.advance(10.0)
        assert [e.id for e in fetcher.claim_batch(2)] == ["job-urgent", "job-4"]  # from the start, in order
    finally:
        runner.conn.close()


@pytest.mark.parametrize("server_url", ["postgresql"], indirect=True)
def test_a_claim_from_the_floor_steps_over_none_of_the_entries_of_finished_rows(server_url: str) -> None:
    # PostgreSQL keeps the index entries of deleted rows until VACUUM: a claim
    # from the start reads every one of them, a claim from the floor none.
    name = f"floor_{uuid.uuid4().hex[:10]}"
    install_tables(server_url, name)
    try:
        execute(server_url, f"ALTER TABLE {name} SET (autovacuum_enabled = false)")  # this table only
        execute(
            server_url,
            f"INSERT INTO {name} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "SELECT 'job-' || g, 'default', 'tests.probe', '{}', 'queued', 0, 3, 1000.0 + g, 1.0 "
            "FROM generate_series(1, 20010) g",
        )
        execute(server_url, f"DELETE FROM {name} WHERE run_at <= 21000.0")  # 20,000 jobs done

        def buffers_read(floor: float | None) -> int:
            if floor is None:
                claim = POSTGRES.sql(queries.CLAIM_RETURNING, name)
                where: tuple[object, ...] = ("default", 5)
            else:
                claim = POSTGRES.sql(queries.CLAIM_RETURNING_FLOOR, name)
                where = ("default", 0, floor, 5)
            conn = Connector(server_url).connect()
            try:
                cursor = conn.cursor()
                cursor.execute("BEGIN")
                cursor.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) " + claim, ("claimed", "owner", "token", 30.0, *where)
                )
                plan = "\n".join(str(row[0]) for row in cursor.fetchall())
                cursor.execute("ROLLBACK")
            finally:
                conn.close()
            scan = re.search(r"Index Scan using \S+_ready.*?Buffers: shared ([^\n]*)", plan, re.S)
            assert scan is not None, plan
            return sum(int(count) for count in re.findall(r"(?:hit|read)=(\d+)", scan.group(1)))

        buffers_read(None)  # the first pass marks the dead entries: later ones read their pages, not the heap
        from_start = buffers_read(None)
        from_floor = buffers_read(21000.0)
        assert from_start > 40, from_start
        assert from_floor < 10, from_floor
    finally:
        drop_tables(server_url, name)
