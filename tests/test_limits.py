"""Concurrency and rate limits: at most N runs of a key at once, at most a rate of starts, across every process."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import ClassVar

import pytest

import syncjobs
from syncjobs import Limit
from syncjobs.database.schema import SCHEMA_VERSION
from syncjobs.limits import parse_rate
from tests.conftest import QueueFactory
from tests.dbworker import Ledger, LedgerJob, LimitedLedgerJob, RatedLedgerJob, Run, Workers, use_ledger
from tests.helpers import WAIT, wait_until
from tests.test_database import drop_tables, execute, old_ddl

pytestmark = pytest.mark.timeout(120)

#: What the probes record: runs going on now and the most at once, per key; when each run began.
LOCK = threading.Lock()
RUNNING: dict[str, int] = defaultdict(int)
PEAK: dict[str, int] = defaultdict(int)
STARTS: dict[str, list[float]] = defaultdict(list)
STARTED: list[str] = []
RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    for record in (RUNNING, PEAK, STARTS):
        record.clear()
    STARTED.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


def _run(key: str, seconds: float = 0.0, block: bool = False) -> None:
    info = syncjobs.current_job()
    assert info is not None
    with LOCK:
        RUNNING[key] += 1
        PEAK[key] = max(PEAK[key], RUNNING[key])
        STARTS[key].append(time.monotonic())
        STARTED.append(info.id)
    try:
        if block:
            assert RELEASE.wait(WAIT)
        elif seconds:
            threading.Event().wait(seconds)  # the work itself: a slow call
    finally:
        with LOCK:
            RUNNING[key] -= 1


@dataclasses.dataclass
class TwoAtOnce(syncjobs.Job):
    NAME = "tests.limits.two_at_once"
    LIMIT: ClassVar[Limit | None] = Limit(running=2)
    n: int

    def run(self) -> None:
        _run("all", seconds=0.02)


@dataclasses.dataclass
class OnePerTenant(syncjobs.Job):
    NAME = "tests.limits.one_per_tenant"
    LIMIT: ClassVar[Limit | None] = Limit("tenant", running=1)
    tenant: str
    block: bool = False

    def run(self) -> None:
        _run(self.tenant, block=self.block)


@dataclasses.dataclass
class OneAtOnceTenPerSecond(syncjobs.Job):
    NAME = "tests.limits.one_at_once_ten_per_second"
    LIMIT: ClassVar[Limit | None] = Limit(running=1, rate="10/s")
    n: int

    def run(self) -> None:
        _run("both")


@dataclasses.dataclass
class TenPerSecond(syncjobs.Job):
    NAME = "tests.limits.ten_per_second"
    LIMIT: ClassVar[Limit | None] = Limit(rate="10/s")
    n: int

    def run(self) -> None:
        _run("rated")


def _queue(make_queue: QueueFactory, workers: int) -> syncjobs.JobQueue:
    queue: syncjobs.JobQueue = make_queue(workers)
    for job_cls in (TwoAtOnce, OnePerTenant, TenPerSecond, OneAtOnceTenPerSecond):
        queue.register(job_cls)
    return queue


def _done(queue: syncjobs.JobQueue, handle: str) -> syncjobs.JobStatus:
    queue.result(handle, timeout=60)
    status = queue.status(handle)
    assert status is not None
    return status


# -- declarations ---------------------------------------------------------------------------


def test_rates_read_as_a_count_per_period() -> None:
    assert parse_rate("100/m") == pytest.approx(0.6)
    assert parse_rate("5/s") == pytest.approx(0.2)
    assert parse_rate(" 1000 / h ") == pytest.approx(3.6)
    assert parse_rate("3/10s") == pytest.approx(10 / 3)
    assert parse_rate("1/d") == 86400
    for bad in ("0/m", "100", "100/week", "1/0s", "-1/s", "x/s", ""):
        with pytest.raises(TypeError, match="rate must be a count per period"):
            Limit(rate=bad)


def test_limit_declarations_are_checked_where_they_are_written() -> None:
    with pytest.raises(TypeError, match=r"give running=.*rate=.*or both"):
        Limit("tenant")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(TypeError, match="running must be an int >= 1"):
            Limit(running=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="payload fields or a key function, not both"):
        Limit("tenant", key=lambda payload: payload["tenant"], running=1)
    with pytest.raises(TypeError, match=r"LIMIT must be a syncjobs\.Limit"):

        class Wrong(syncjobs.Job):
            NAME = "tests.limits.wrong"
            LIMIT = 2  # type: ignore[assignment]

    @dataclasses.dataclass
    class Typo(syncjobs.Job):
        NAME = "tests.limits.typo"
        LIMIT: ClassVar[Limit | None] = Limit("tennant", running=1)
        tenant: str

    with pytest.raises(TypeError, match=r"Limit\(\) names 'tennant', not among \['tenant'\]"):
        syncjobs.InMemoryJobQueue(workers=0).register(Typo)
    queue = syncjobs.InMemoryJobQueue(workers=0)
    with pytest.raises(TypeError, match=r"task .*: Limit\(\) names 'user'"):

        @queue.task(limit=Limit("user", running=1))
        def typo(user_id: int) -> None: ...

    assert repr(Limit("tenant", running=2, rate="5/s")) == "Limit('tenant', running=2, rate='5/s')"
    assert Limit(running=2) == Limit(running=2) != Limit(running=3)


def test_a_limit_key_that_cannot_be_made_is_a_queue_error_at_dispatch() -> None:
    queue = syncjobs.InMemoryJobQueue(workers=0)

    @dataclasses.dataclass
    class Keyed(syncjobs.Job):
        NAME = "tests.limits.keyed"
        LIMIT: ClassVar[Limit | None] = Limit(key=lambda payload: payload["missing"], running=1)
        tenant: str

        def run(self) -> None: ...

    queue.register(Keyed)
    with pytest.raises(syncjobs.QueueError, match=r"'tests\.limits\.keyed': its limit key function raised KeyError"):
        queue.dispatch(Keyed("a"))
    assert queue.pending_count() == 0


# -- on every backend ---------------------------------------------------------------------------


def test_never_more_runs_at_once_than_the_limit_and_every_job_runs(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=6)
    queue.start()
    handles = [queue.dispatch(TwoAtOnce(n)) for n in range(24)]
    assert all(_done(queue, handle).state == "done" for handle in handles)
    assert PEAK["all"] <= 2
    assert len(STARTS["all"]) == 24


def test_a_limit_per_payload_key_holds_each_key_apart(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=4)
    queue.start()
    first = queue.dispatch(OnePerTenant("a", block=True))
    wait_until(lambda: first in STARTED, what="tenant a's first run")
    second = queue.dispatch(OnePerTenant("a"))
    other = queue.dispatch(OnePerTenant("b"))
    # Tenant b is not held back by a's run; a's second waits for it, not failed, not run.
    assert _done(queue, other).state == "done"
    status = queue.status(second)
    assert status is not None
    assert status.state == "queued"
    assert second not in STARTED
    RELEASE.set()
    assert _done(queue, second).state == "done"
    assert _done(queue, first).state == "done"
    assert PEAK["a"] == 1


def test_a_job_waiting_for_its_limit_can_be_cancelled_and_the_next_goes_in_its_place(
    make_queue: QueueFactory,
) -> None:
    queue = _queue(make_queue, workers=3)
    queue.start()
    first = queue.dispatch(OnePerTenant("a", block=True))
    wait_until(lambda: first in STARTED, what="the first run")
    waiting = queue.dispatch(OnePerTenant("a"))
    after = queue.dispatch(OnePerTenant("a"))
    assert queue.cancel(waiting)
    RELEASE.set()
    assert _done(queue, after).state == "done"
    status = queue.status(waiting)
    assert status is not None
    assert status.state == "cancelled"
    assert waiting not in STARTED


def test_a_rate_limit_spaces_the_starts_and_holds_back_none(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=4)
    queue.start()
    handles = [queue.dispatch(TenPerSecond(n)) for n in range(6)]
    assert all(_done(queue, handle).state == "done" for handle in handles)
    _spaced_starts("rated", 0.1)


def _spaced_starts(key: str, interval: float) -> list[float]:
    """The starts of ``key``'s runs, checked: any k+1 of them span at least k intervals.

    Within half an interval: the time a claimed job takes to reach a worker's thread.
    """
    starts = sorted(STARTS[key])
    for i, begun in enumerate(starts):
        for j in range(i + 1, len(starts)):
            assert starts[j] - begun >= (j - i) * interval - interval / 2, starts
    return starts


def test_runs_at_once_and_a_rate_together_keep_both_and_keep_going(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=4)
    queue.start()
    handles = [queue.dispatch(OneAtOnceTenPerSecond(n)) for n in range(8)]
    assert all(_done(queue, handle).state == "done" for handle in handles)
    assert PEAK["both"] == 1
    starts = _spaced_starts("both", 0.1)
    # Each run's end lets the next go at once: none waits for housekeeping (seconds); 7 turns take 0.7 s.
    assert starts[-1] - starts[0] < 3.5, starts


def test_the_run_of_a_job_that_ends_in_a_retry_gives_its_permit_back(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=2)

    @dataclasses.dataclass
    class FailsOnce(syncjobs.Job):
        NAME = "tests.limits.fails_once"
        LIMIT: ClassVar[Limit | None] = Limit(running=1)
        n: int

        def run(self) -> None:
            info = syncjobs.current_job()
            assert info is not None
            _run("retried")
            if info.attempt == 0:
                raise syncjobs.Fatal("fails") if self.n < 0 else RuntimeError("once")

        def retry_wait(self, failed_attempt: int) -> float:
            return 0.0

    queue.register(FailsOnce)
    queue.start()
    handles = [queue.dispatch(FailsOnce(n)) for n in (-1, 1, 2)]
    states = [_end_state(queue, handle) for handle in handles]
    assert states == ["dead", "done", "done"]
    assert PEAK["retried"] == 1


def _end_state(queue: syncjobs.JobQueue, handle: str) -> str:
    with contextlib.suppress(syncjobs.JobFailed):
        queue.result(handle, timeout=60)
    status = queue.status(handle)
    assert status is not None
    return status.state


# -- on each database, across processes -----------------------------------------------------


def _most_at_once(runs: list[Run]) -> int:
    events = sorted([(run.started, 1) for run in runs] + [(run.ended or float("inf"), -1) for run in runs])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _runs_in_processes(
    url: str, ledger: Ledger, jobs: list[LedgerJob], *, processes: int, until: int, timeout: float
) -> list[Run]:
    """Dispatch ``jobs`` to ``processes`` worker processes of 4 threads on a table of their own; the runs begun,
    once ``until`` have ended."""
    name = jobs[0].queue
    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(url, workers=0, table=table, queue=name)
    queue.register(type(jobs[0]))
    workers = Workers(url, name, table=table, workers=4)
    try:
        for _ in range(processes):
            workers.spawn()
        queue.dispatch_many(jobs)
        wait_until(lambda: len([r for r in ledger.details(name) if r.ended]) >= until, timeout, f"{until} runs")
    finally:
        workers.stop()
        queue.shutdown(grace=0)
    drop_tables(url, table)
    return ledger.details(name)


@pytest.mark.heavy
@pytest.mark.timeout(180)
def test_four_processes_of_four_threads_run_at_most_two_at_once(db_url: str, ledger: Ledger) -> None:
    name = f"q-{uuid.uuid4().hex[:10]}"
    jobs: list[LedgerJob] = [LimitedLedgerJob(name, n, seconds=0.05) for n in range(60)]
    runs = _runs_in_processes(db_url, ledger, jobs, processes=4, until=60, timeout=90)
    assert sorted(run.n for run in runs) == list(range(60))  # every job, once
    assert _most_at_once(runs) == 2
    assert len({run.pid for run in runs}) >= 2


@pytest.mark.timeout(300)
def test_a_rate_of_sixty_a_minute_holds_over_two_minutes_across_processes(server_url: str) -> None:
    if "postgresql" not in server_url:
        pytest.skip("two minutes of waiting: run once, on PostgreSQL")
    ledger = Ledger(server_url)
    ledger.create()
    name = f"q-{uuid.uuid4().hex[:10]}"
    jobs: list[LedgerJob] = [RatedLedgerJob(name, n) for n in range(140)]
    runs = _runs_in_processes(server_url, ledger, jobs, processes=2, until=122, timeout=200)
    ledger.close()
    starts = sorted(run.started for run in runs)
    # 121 starts take at least 120 s (one a second, within one token); none is held back much longer.
    assert starts[120] - starts[0] >= 120 - 0.5
    assert starts[120] - starts[0] <= 120 + 15
    for i in range(len(starts) - 60):
        assert starts[i + 60] - starts[i] >= 60 - 0.5  # any 61 starts span a minute


@pytest.mark.timeout(120)
def test_the_permit_of_a_killed_worker_ends_with_its_lease_and_the_waiting_job_runs(
    db_url: str, ledger: Ledger
) -> None:
    name = f"q-{uuid.uuid4().hex[:10]}"
    table = f"t_{uuid.uuid4().hex[:10]}"
    # Two at once: the victim takes both permits with two long runs, then dies.
    workers = Workers(db_url, name, table=table, workers=2, lease=2.0)
    queue = syncjobs.DatabaseJobQueue(db_url, workers=2, table=table, queue=name, lease=2.0, poll_interval=0.2)
    queue.register(LimitedLedgerJob)
    use_ledger(ledger)
    try:
        victim = workers.spawn()
        queue.dispatch_many([LimitedLedgerJob(name, n, seconds=60, slow_pid=victim.pid) for n in range(2)])
        wait_until(lambda: len(ledger.details(name)) == 2, what="the victim's two runs")
        victim.send_signal(signal.SIGKILL)
        victim.wait(WAIT)
        later = queue.dispatch(LimitedLedgerJob(name, 2))
        queue.start()
        # Its permits end with the victim's leases: the job dispatched after runs.
        queue.result(later, timeout=60)
        # And the victim's two jobs, back by their leases, run again here.
        wait_until(lambda: {run.n for run in ledger.details(name) if run.ended} == {0, 1, 2}, what="all three")
    finally:
        queue.shutdown(grace=0)
        workers.stop()
        use_ledger(None)
    drop_tables(db_url, table)


def test_a_populated_version_8_table_gains_the_limit_tables_in_place_and_its_jobs_run_within_limits(
    db_url: str,
) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, table=table, auto_schema=False, workers=4, poll_interval=0.2)
    queue.register(TwoAtOnce)
    try:
        for statement in old_ddl(db_url, table, 8):
            execute(db_url, statement)
        execute(db_url, f"INSERT INTO {table}_schema (version) VALUES (8)")
        waiting = [str(uuid.uuid4()) for _ in range(6)]
        for job_id in waiting:  # dispatched by the version before: they get their permits like any
            execute(
                db_url,
                f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
                "VALUES (?, 'default', 'tests.limits.two_at_once', '{\"n\": 0}', 'queued', 0, 3, 0, 0)",
                (job_id,),
            )
        with pytest.raises(syncjobs.QueueError, match=rf"version 8, this syncjobs needs {SCHEMA_VERSION}"):
            queue.start()
        planned = queue.admin.ddl()  # what `syncjobs migrate --sql` prints
        assert [s for s in planned if s.startswith(f"CREATE TABLE IF NOT EXISTS {table}_permits")]
        # No column of the jobs table changes for the limits (version 10 adds its traceback column).
        added = [s for s in planned if "ADD COLUMN" in s or "DROP" in s]
        assert [s.split("ADD COLUMN ")[-1].split()[-2] for s in added] == ["traceback"], added
        assert queue.admin.migrate() == 8
        queue.start()
        assert all(_done(queue, job_id).state == "done" for job_id in waiting)
        assert PEAK["all"] <= 2
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)
