"""Jobs dispatched one by one in a stream come in one claim, not a claim each."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from tests.helpers import WAIT
from tests.test_claim_floor import _Connection, fetcher_on
from tests.test_database import drop_tables, execute, install_tables

T = TypeVar("T")


class _CountingCursor:
    def __init__(self, cursor: Any, claims: list[int]) -> None:
        self._cursor = cursor
        self._claims = claims

    def execute(self, sql: str, params: Any = ()) -> Any:
        result = self._cursor.execute(sql, params)
        if "ORDER BY run_at LIMIT" in sql and "UPDATE" in sql:  # a claim (UPDATE ... RETURNING)
            self._claims.append(1)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _CountingConnection(_Connection):
    """Counts the claims the fetcher runs through it (SQLite: one UPDATE … RETURNING each)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.claims: list[int] = []

    def run(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        return super().run(lambda cursor: operation(_CountingCursor(cursor, self.claims)), deadline=deadline)

    def transaction(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        return super().transaction(lambda cursor: operation(_CountingCursor(cursor, self.claims)), deadline=deadline)


@pytest.mark.timeout(60)
def test_jobs_that_come_during_the_rest_after_a_claim_come_in_one_claim(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    table = f"coalesce_{uuid.uuid4().hex[:8]}"
    install_tables(url, table)
    runner = _CountingConnection(url)

    def insert(job_id: str) -> None:
        execute(
            url,
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, 'default', 'tests.probe', '{}', 'queued', 0, 3, 1.0, 1.0)",
            (job_id,),
        )

    fetcher = fetcher_on(runner, table, poll_interval=600.0, prefetch=20, coalesce=0.5)
    stop = threading.Event()
    loop = threading.Thread(target=fetcher.loop, args=(stop,), name="test-fetcher")
    loop.start()
    try:
        insert("job-first")
        fetcher.kick()
        first = fetcher.take()
        assert first is not None
        assert first.id == "job-first"
        claims_before = len(runner.claims)
        for i in range(10):  # a stream: each one kicks, all within the rest of 0.5 s
            insert(f"job-{i}")
            fetcher.kick()
        taken = [fetcher.take() for _ in range(10)]
        assert sorted(e.id for e in taken if e is not None) == sorted(f"job-{i}" for i in range(10))
        assert len(runner.claims) - claims_before == 1, runner.claims
    finally:
        stop.set()
        fetcher.stop()
        fetcher.wake(1)
        loop.join(WAIT)
        runner.conn.close()
        drop_tables(url, table)
    assert not loop.is_alive()
