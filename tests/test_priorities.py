"""Priorities: of the jobs due, the highest priority runs first, then by due time and dispatch order."""

from __future__ import annotations

import dataclasses
import queue as stdqueue
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import ClassVar

import pytest

import syncjobs
from syncjobs.database.schema import SCHEMA_VERSION
from syncjobs.envelope import Envelope, make_envelope
from syncjobs.ready import ReadyQueue
from tests.conftest import TEST_TABLE, Backend, QueueFactory
from tests.helpers import WAIT, wait_until

pytestmark = pytest.mark.timeout(120)

#: Every run of a RankedJob, in the order they began: (label, priority it was dispatched with).
RUNS: list[tuple[int, int]] = []
_RUNS_LOCK = threading.Lock()
#: What the job of label -2 waits for.
RELEASE = threading.Event()


@dataclasses.dataclass
class RankedJob(syncjobs.Job):
    NAME = "tests.ranked"
    label: int
    priority: int

    def run(self) -> None:
        with _RUNS_LOCK:
            RUNS.append((self.label, self.priority))
        info = syncjobs.current_job()
        if self.label == -2:
            assert RELEASE.wait(WAIT)
        if self.label == -1 and info is not None and info.attempt == 0:
            raise ValueError("a first run that fails")

    def retry_wait(self, failed_attempt: int) -> float:
        return 0.0


@dataclasses.dataclass
class UrgentJob(RankedJob):
    NAME = "tests.ranked_urgent"
    PRIORITY: ClassVar[int] = 60


@pytest.fixture(autouse=True)
def _fresh_runs() -> Iterator[None]:
    RUNS.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


def _wait_runs(count: int) -> list[tuple[int, int]]:
    wait_until(lambda: len(RUNS) >= count, timeout=60, what=f"{count} runs")
    with _RUNS_LOCK:
        return list(RUNS)


# -- the contract, on every backend ----------------------------------------------


def test_a_thousand_jobs_of_mixed_priorities_dispatched_to_a_paused_queue_run_in_priority_order(
    make_queue: QueueFactory,
) -> None:
    queue = make_queue(1)  # one worker: the order runs begin in is the order they were taken
    queue.register(RankedJob)
    queue.register(UrgentJob)
    chooser = random.Random(12)
    levels = [-100, -7, 0, 0, 0, 3, 60, 100]  # priority 0 most often, as in an app
    for label in range(1000):
        priority = chooser.choice(levels)
        if priority == 60 and label % 2:
            queue.dispatch(UrgentJob(label, 60))  # the class's PRIORITY
        elif priority == 0 and label % 3 == 0:
            queue.dispatch(RankedJob(label, 0))  # the default
        else:
            queue.dispatch(RankedJob(label, priority), priority=priority)
    queue.start()
    runs = _wait_runs(1000)
    priorities = [priority for _, priority in runs]
    assert priorities == sorted(priorities, reverse=True)
    for level in set(levels):
        labels = [label for label, priority in runs if priority == level]
        assert labels == sorted(labels), f"priority {level}: not in dispatch order"
    assert sorted(label for label, _ in runs) == list(range(1000))  # each exactly once


def test_a_job_of_higher_priority_dispatched_behind_a_backlog_runs_next(make_queue: QueueFactory) -> None:
    queue = make_queue(1)
    if queue.__class__ is not syncjobs.InMemoryJobQueue:
        # A database worker may have claimed rows ahead, and reads the rows of one priority on while its
        # claims come back full (at most 0.25 s): test_claim_floor.py checks that with a clock of its own.
        pytest.skip("in memory the next job taken is the highest priority's, exactly")
    queue.register(RankedJob)
    queue.dispatch(RankedJob(-2, 0))  # blocks its worker until released
    for label in range(300):
        queue.dispatch(RankedJob(label, 0))
    queue.start()
    wait_until(lambda: RUNS[:1] == [(-2, 0)], what="the first job to run")
    queue.dispatch(RankedJob(1000, 100), priority=100)
    RELEASE.set()
    runs = _wait_runs(302)
    assert [label for label, _ in runs] == [-2, 1000, *range(300)]


def test_a_retried_job_keeps_its_priority(backend: Backend) -> None:
    queue = backend.make(1)
    queue.register(RankedJob)
    retried = queue.dispatch(RankedJob(-1, 50), priority=50)  # fails its first run, retried at once
    queue.dispatch(RankedJob(-2, 0))  # then this one holds the worker until released
    for label in range(100):
        queue.dispatch(RankedJob(label, 0))
    queue.start()
    # The retry may run before the job that holds the worker, or after it, not after the 100 others.
    wait_until(lambda: (-2, 0) in RUNS, what="the job that holds the worker")
    if backend.url is not None:
        # Parked in its row with its priority; a worker reads the rows of one priority on while its claims
        # come back full (at most 0.25 s: test_claim_floor.py), so when it runs is not exact here.
        from tests.test_database import execute

        row = execute(backend.url, f"SELECT priority, attempt FROM {TEST_TABLE} WHERE id = ?", (str(retried),))
        assert row == [(50, 1)] or (row == [] and RUNS.count((-1, 50)) == 2), row
    assert queue.settle_timers()  # in memory, the retry (due at once) is handed over by the timer thread
    RELEASE.set()
    runs = _wait_runs(103)
    assert runs.count((-1, 50)) == 2
    if backend.url is None:
        assert runs.index((-1, 50), 1) <= 2  # ahead of the 100 jobs of priority 0 due before it


def test_dispatch_many_gives_every_job_the_priority_or_each_its_classs(backend: Backend) -> None:
    if backend.url is None:
        pytest.skip("dispatch_many is the database queue's")
    from tests.test_database import execute

    queue = backend.make(0)
    queue.register(RankedJob)
    queue.register(UrgentJob)
    given = queue.dispatch_many([RankedJob(1, 0), UrgentJob(2, 0)], priority=-3)
    declared = queue.dispatch_many([RankedJob(3, 0), UrgentJob(4, 0)])
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests\.ranked': priority must be an int"):
        queue.dispatch_many([RankedJob(5, 0)], priority=-101)
    ids = [str(handle) for handle in (*given, *declared)]
    rows = dict(execute(backend.url, f"SELECT id, priority FROM {TEST_TABLE} WHERE queue = ?", (queue.queue_name,)))
    assert [rows[job_id] for job_id in ids] == [-3, -3, 0, 60]


def test_a_prepared_job_keeps_its_priority_and_a_test_queue_records_it(make_queue: QueueFactory) -> None:
    from syncjobs.testing import TestQueue

    queue = make_queue(1)
    queue.register(RankedJob)
    later = [queue.prepare(RankedJob(label, 0)) for label in range(3)]
    urgent = queue.prepare(RankedJob(9, 40), priority=40)
    for prepared in [*later, urgent]:
        prepared.submit()
    queue.start()
    assert [label for label, _ in _wait_runs(4)] == [9, 0, 1, 2]

    test_queue = TestQueue()
    test_queue.register(RankedJob)
    test_queue.register(UrgentJob)
    test_queue.dispatch(RankedJob(1, 0), priority=5)
    test_queue.dispatch(UrgentJob(2, 0))
    assert [record.priority for record in test_queue.dispatched] == [5, 60]


def test_status_says_a_jobs_priority_while_it_waits_and_once_it_is_done(make_queue: QueueFactory) -> None:
    queue = make_queue(1)
    queue.register(RankedJob)
    queue.register(UrgentJob)
    handles = [
        queue.dispatch(RankedJob(1, 0)),
        queue.dispatch(UrgentJob(2, 60)),
        queue.dispatch(RankedJob(3, -4), priority=-4),
    ]
    waiting = [queue.status(str(handle)) for handle in handles]
    assert [(s.state, s.priority) for s in waiting if s is not None] == [("queued", 0), ("queued", 60), ("queued", -4)]
    queue.start()
    for handle in handles:
        handle.result(WAIT)
    done = [queue.status(str(handle)) for handle in handles]
    assert [(s.state, s.priority) for s in done if s is not None] == [("done", 0), ("done", 60), ("done", -4)]


# -- bad priorities, refused where they are written ---------------------------------


@pytest.mark.parametrize("bad", [101, -101, True, 1.5, "high", None])
def test_a_job_class_with_a_bad_priority_is_refused_at_its_definition(bad: object) -> None:
    with pytest.raises(TypeError, match=r"job class \S*Bad: PRIORITY must be an int from -100 to 100"):

        class Bad(syncjobs.Job):
            NAME = "tests.bad_priority"
            PRIORITY = bad  # type: ignore[assignment]


@pytest.mark.parametrize("bad", [101, -101, True, 2.0, "high"])
def test_a_dispatch_with_a_bad_priority_names_the_job_and_enqueues_nothing(
    make_queue: QueueFactory, bad: object
) -> None:
    queue = make_queue(0)
    queue.register(RankedJob)
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.ranked': priority must be an int from -100 to 100"):
        queue.dispatch(RankedJob(1, 0), priority=bad)
    assert queue.pending_count() == 0


def test_a_task_takes_a_priority_for_every_call_and_per_call(make_queue: QueueFactory) -> None:
    queue = make_queue(1)
    task = queue.task(name="tests.ranked_task", priority=20)(ranked_task)
    assert task.job_class.PRIORITY == 20
    task.dispatch(1)  # 20
    task.using(priority=-20).dispatch(2)
    task.using(priority=90).dispatch(3)
    queue.register(RankedJob)
    queue.dispatch(RankedJob(4, 0))
    queue.start()
    wait_until(lambda: len(TASK_RUNS) == 3 and len(RUNS) == 1, what="every run")
    assert TASK_RUNS == [3, 1, 2]
    with pytest.raises(TypeError, match=r"priority must be an int from -100 to 100"):
        queue.task(name="tests.ranked_task_bad", priority=500)(ranked_task)


TASK_RUNS: list[int] = []


def ranked_task(label: int) -> None:
    TASK_RUNS.append(label)


@pytest.fixture(autouse=True)
def _fresh_task_runs() -> None:
    TASK_RUNS.clear()


# -- the in-memory ready queue ----------------------------------------------------


def _envelope(label: str, priority: int = 0) -> Envelope:
    return make_envelope(label, "tests.e", "{}", 1, priority=priority)


def test_jobs_of_the_default_priority_keep_no_priority_of_their_own() -> None:
    # What lets a million pending jobs cost no more than before priorities came.
    assert not hasattr(_envelope("a"), "__dict__")
    assert "priority" not in Envelope.__slots__
    assert sys.getsizeof(_envelope("a")) < sys.getsizeof(_envelope("b", 5))
    assert _envelope("a").priority == 0
    assert _envelope("b", 5).priority == 5


def test_the_first_job_of_another_priority_ranks_the_jobs_already_waiting_in_their_order() -> None:
    ready = ReadyQueue()
    for label in "abc":
        ready.put(_envelope(label))
    ready.wake()
    ready.put(_envelope("urgent", 9))
    ready.put(_envelope("d"))
    ready.put(_envelope("late", -9))
    ready.put(_envelope("e"))
    taken = [ready.get() for _ in range(8)]
    assert [e.id if e is not None else None for e in taken if e is not None] == [
        "urgent",
        "a",
        "b",
        "c",
        "d",
        "e",
        "late",
    ]
    assert taken.count(None) == 1  # the wake-up still wakes one get()


def test_a_ready_queue_hands_every_job_once_to_many_workers_while_it_turns_ranked() -> None:
    # Threads switch every microsecond, not every 5 ms: a race between the turn to ranked and a get()
    # that reads the queue's state without the lock shows here, where it would hide at the default.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _hand_out_every_job_once()
    finally:
        sys.setswitchinterval(switch)


def _hand_out_every_job_once() -> None:
    ready = ReadyQueue()
    taken: stdqueue.SimpleQueue[str] = stdqueue.SimpleQueue()
    count = 4000

    def worker() -> None:
        while (envelope := ready.get()) is not None:
            taken.put(envelope.id)

    workers = [threading.Thread(target=worker, name=f"test-ready-{n}") for n in range(4)]
    for thread in workers:
        thread.start()
    barrier = threading.Barrier(3)

    def dispatcher(offset: int, ranked_from: int | None) -> None:
        barrier.wait(WAIT)
        for n in range(offset, offset + count):
            ready.put(_envelope(str(n), 1 if ranked_from is not None and n >= ranked_from else 0))

    dispatchers = [
        threading.Thread(target=dispatcher, args=(0, None)),
        threading.Thread(target=dispatcher, args=(count, count + count // 2)),  # turns it ranked halfway
        threading.Thread(target=dispatcher, args=(2 * count, None)),
    ]
    for thread in dispatchers:
        thread.start()
    for thread in dispatchers:
        thread.join(WAIT)
    wait_until(lambda: taken.qsize() >= 3 * count, what="every job taken")
    for _ in workers:
        ready.wake()
    for thread in workers:
        thread.join(WAIT)
        assert not thread.is_alive()
    ids = [taken.get_nowait() for _ in range(taken.qsize())]
    assert sorted(ids, key=int) == [str(n) for n in range(3 * count)]


def test_a_worker_rests_only_until_the_next_parked_row_of_any_priority_is_due(db_url: str) -> None:
    from tests.test_claim_floor import _Connection, _insert_due, fetcher_on
    from tests.test_database import drop_tables, install_tables

    table = f"t_{uuid.uuid4().hex[:10]}"
    install_tables(db_url, table)
    runner = _Connection(db_url)
    try:
        fetcher = fetcher_on(runner, table, poll_interval=30.0, prefetch=0)
        assert fetcher.idle_wait() == 30.0  # nothing waits: the poll interval
        now = time.time()
        for job_id, priority, due_in in (("high", 9, 600.0), ("mid", 0, 120.0), ("low", -9, 5.0), ("also", 0, 900.0)):
            _insert_due(db_url, table, job_id, 1_000_000_000.0 - now - due_in, priority=priority)
        assert 3.0 < fetcher.idle_wait() <= 5.0  # the lowest priority's row is due first
        _insert_due(db_url, table, "due", 1_000_000_000.0 - now + 1.0, priority=5)
        assert fetcher.idle_wait() == 0.0  # one is due already
    finally:
        runner.conn.close()
        drop_tables(db_url, table)


# -- the schema: version 5 tables gain priorities in place ------------------------------


def test_a_populated_version_5_table_gains_priorities_and_runs_its_jobs(db_url: str) -> None:
    from tests.test_database import columns, drop_tables, execute, old_ddl

    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, table=table, auto_schema=False, workers=1, poll_interval=0.2)
    queue.register(RankedJob)
    try:
        for statement in old_ddl(db_url, table, 5):
            execute(db_url, statement)
        execute(db_url, f"INSERT INTO {table}_schema (version) VALUES (5)")
        assert "priority" not in columns(db_url, table)
        insert = (
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, 'default', 'tests.ranked', ?, 'queued', 0, 3, ?, 0)"
        )
        for label in range(3):
            execute(db_url, insert, (str(uuid.uuid4()), f'{{"label": {label}, "priority": 0}}', float(label)))
        with pytest.raises(syncjobs.QueueError, match=rf"version 5, this syncjobs needs {SCHEMA_VERSION}"):
            queue.start()
        # What `syncjobs migrate --sql` prints for this table, run by hand as a team that runs its own
        # migrations would: it adds the columns (then the index on them) and records the version.
        planned = queue.admin.ddl()
        added = [s for s in planned if s.startswith("ALTER TABLE") and " ADD COLUMN" in s]
        assert len(added) == 3, added  # priority on the jobs table and its results; version 10's traceback
        assert all(" priority INTEGER" in s for s in added[:2]), added
        assert " traceback " in added[2], added
        [ready] = [s for s in planned if f"{table}_ready" in s and not s.startswith("CREATE TABLE")]
        [retired] = [s for s in planned if "DROP INDEX" in s and f"{table}_claim" in s]  # the due-time index
        assert planned.index(added[-1]) < planned.index(ready) < planned.index(retired)
        for statement in planned:
            execute(db_url, statement)
        assert queue.admin.migrate() == SCHEMA_VERSION  # nothing left to do
        assert not [s for s in queue.admin.ddl() if s.startswith("ALTER TABLE") and " ADD " in s]
        assert "priority" in columns(db_url, table)
        assert execute(db_url, f"SELECT DISTINCT priority FROM {table}") == [(0,)]
        queue.dispatch(RankedJob(9, 10), priority=10)
        queue.start()
        assert [label for label, _ in _wait_runs(4)] == [9, 0, 1, 2]
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)
