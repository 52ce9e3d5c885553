"""Unique jobs: while a job holds its key, a dispatch of another with that key enqueues nothing, returns its handle."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

import syncjobs
from syncjobs import Unique
from syncjobs.database.dialects import Connector
from syncjobs.database.schema import SCHEMA_VERSION
from syncjobs.testing import TestQueue
from tests.conftest import SERVER_URLS, TEST_TABLE, Backend, QueueFactory, _reachable
from tests.helpers import WAIT, FakeClock, wait_until
from tests.test_database import drop_tables, execute, install_tables, old_ddl, user_connection

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Job ids of the runs that began, and what a run of BlockingSync waits for.
STARTED: list[str] = []
RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    STARTED.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


@dataclasses.dataclass
class SyncUser(syncjobs.Job):
    """Held while queued (the default): a second sync asked before the first began adds nothing."""

    NAME = "tests.unique.sync_user"
    UNIQUE: ClassVar[Unique | None] = Unique("user_id")
    user_id: int
    reason: str = ""

    def run(self) -> int:
        info = syncjobs.current_job()
        assert info is not None
        STARTED.append(info.id)
        if self.reason == "block":
            assert RELEASE.wait(WAIT)
        if self.reason == "fail":
            raise syncjobs.Fatal("asked to fail")
        return self.user_id


@dataclasses.dataclass
class SyncUnfinished(SyncUser):
    NAME = "tests.unique.sync_unfinished"
    UNIQUE = Unique("user_id", holds="unfinished")


@dataclasses.dataclass
class SyncForAMinute(SyncUser):
    NAME = "tests.unique.sync_minute"
    UNIQUE = Unique("user_id", seconds=60)


@dataclasses.dataclass
class Mail(syncjobs.Job):
    """Unique by a function of the payload: one mail per address, whatever its case."""

    NAME = "tests.unique.mail"
    UNIQUE = Unique(key=lambda payload: payload["to"].lower())
    to: str

    def run(self) -> None:
        pass


@dataclasses.dataclass
class Whole(syncjobs.Job):
    """Unique by its whole payload."""

    NAME = "tests.unique.whole"
    UNIQUE = Unique()
    a: int
    b: Any = None

    def run(self) -> None:
        pass


@dataclasses.dataclass
class Plain(syncjobs.Job):
    NAME = "tests.unique.plain"
    user_id: int

    def run(self) -> None:
        pass


CLASSES = (SyncUser, SyncUnfinished, SyncForAMinute, Mail, Whole, Plain)


def _queue(make_queue: QueueFactory, workers: int = 1, **options: Any) -> Any:
    queue = make_queue(workers, **options)
    for job_cls in CLASSES:
        queue.register(job_cls)
    return queue


def _end(queue: Any, handle: syncjobs.JobHandle) -> syncjobs.JobStatus:
    wait_until(lambda: (status := handle.status()) is not None and status.finished, what=f"job {handle} to end")
    status = handle.status()
    assert status is not None
    return status


# -- the contract, on every backend ---------------------------------------------------


def test_a_duplicate_dispatch_enqueues_nothing_and_returns_the_holders_handle(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue)
    first = queue.dispatch(SyncUser(7, "first"))
    again = queue.dispatch(SyncUser(7, "second"))  # the key is user_id only
    other = queue.dispatch(SyncUser(8))
    plain = [queue.dispatch(Plain(7)), queue.dispatch(Plain(7))]  # no UNIQUE: both enqueued

    assert first.duplicate is False
    assert other.duplicate is False
    assert again == first
    assert again.duplicate is True
    assert again.id == first.id
    assert "duplicate=True" in repr(again)
    assert other != first
    assert plain[0] != plain[1]
    assert queue.pending_count() == 4
    status = again.status()
    assert status is not None
    assert status.payload == {"user_id": 7, "reason": "first"}

    queue.start()
    assert again.result(WAIT) == 7
    assert other.result(WAIT) == 8
    wait_until(lambda: queue.pending_count() == 0)
    assert STARTED.count(first.id) == 1
    assert len(STARTED) == 2


def test_held_while_queued_a_job_that_has_begun_lets_a_new_one_in(backend: Backend) -> None:
    # No row claimed ahead for the busy worker: one claimed counts as begun.
    queue = _queue(backend.make, **({"prefetch": 0} if backend.is_database else {}))
    queue.start()
    running = queue.dispatch(SyncUser(1, "block"))
    wait_until(lambda: running.id in STARTED, what="the first run to begin")
    queued = queue.dispatch(SyncUser(1, "after the change"))  # the run began: this one is new
    assert queued != running
    assert not queued.duplicate
    assert queue.dispatch(SyncUser(1)) == queued  # and now holds the key, while it waits
    RELEASE.set()
    assert running.result(WAIT) == 1
    assert queued.result(WAIT) == 1
    fresh = queue.dispatch(SyncUser(1))
    assert not fresh.duplicate
    assert fresh not in (running, queued)
    assert fresh.result(WAIT) == 1


def test_held_until_finished_a_running_job_keeps_its_key_until_it_is_done_dead_or_cancelled(
    make_queue: QueueFactory,
) -> None:
    queue = _queue(make_queue)
    queue.start()
    running = queue.dispatch(SyncUnfinished(1, "block"))
    wait_until(lambda: running.id in STARTED, what="the run to begin")
    assert queue.dispatch(SyncUnfinished(1)) == running  # it runs: still holds
    RELEASE.set()
    assert running.result(WAIT) == 1
    dying = queue.dispatch(SyncUnfinished(1, "fail"))
    assert not dying.duplicate
    assert _end(queue, dying).state == "dead"
    waiting = queue.dispatch(SyncUnfinished(1), delay=3600)  # a dead letter holds nothing
    assert not waiting.duplicate
    assert queue.dispatch(SyncUnfinished(1)) == waiting
    assert waiting.cancel()
    after = queue.dispatch(SyncUnfinished(1))  # nor does a cancelled job
    assert not after.duplicate
    assert after != waiting
    assert after.result(WAIT) == 1


def test_held_for_seconds_after_dispatch_even_once_done(backend: Backend) -> None:
    clock = FakeClock() if backend.url is None else None
    queue = backend.make(1, clock=clock) if clock is not None else backend.make(1)
    for job_cls in CLASSES:
        queue.register(job_cls)
    queue.start()
    first = queue.dispatch(SyncForAMinute(3))
    assert first.result(WAIT) == 3
    assert queue.dispatch(SyncForAMinute(3)) == first  # done, and held for its minute
    # The minute passes: on the store's clock (in memory), or, since no test can move a database's
    # clock, the key's expiry is moved back by hand.
    if clock is not None:
        clock.advance(61)
    else:
        execute(backend.url, f"UPDATE {TEST_TABLE}_unique SET expires_at = expires_at - 61")  # type: ignore[arg-type]
    later = queue.dispatch(SyncForAMinute(3))
    assert not later.duplicate
    assert later != first
    assert later.result(WAIT) == 3


def test_a_key_function_or_the_whole_payload_makes_the_key(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=0)
    mail = queue.dispatch(Mail("Ann@Example.com"))
    assert queue.dispatch(Mail("ann@example.COM")) == mail
    assert queue.dispatch(Mail("bob@example.com")) != mail
    whole = queue.dispatch(Whole(1, {"x": [1, 2]}))
    assert queue.dispatch(Whole(1, {"x": [1, 2]})) == whole
    assert not queue.dispatch(Whole(1, {"x": [2, 1]})).duplicate
    assert not queue.dispatch(Whole(2, {"x": [1, 2]})).duplicate
    # Two kinds of job never share a key, even with the same values.
    assert not queue.dispatch(SyncUnfinished(5)).duplicate
    assert not queue.dispatch(SyncUser(5)).duplicate
    assert queue.pending_count() == 7


def test_a_key_that_cannot_be_made_is_a_queue_error_naming_the_job_and_nothing_is_enqueued(
    make_queue: QueueFactory,
) -> None:
    queue = _queue(make_queue, workers=0)

    @dataclasses.dataclass
    class Crooked(syncjobs.Job):
        NAME = "tests.unique.crooked"
        UNIQUE = Unique(key=lambda payload: payload["missing"])
        value: int

        def run(self) -> None:
            pass

    @dataclasses.dataclass
    class NotJson(syncjobs.Job):
        NAME = "tests.unique.not_json"
        UNIQUE = Unique(key=lambda payload: object())
        value: int

        def run(self) -> None:
            pass

    class Loose(syncjobs.Job):  # not a dataclass: its fields are only known at dispatch
        NAME = "tests.unique.loose"
        UNIQUE = Unique("user_id")

        def __init__(self, **fields: Any) -> None:
            vars(self).update(fields)

        def run(self) -> None:
            pass

    for job_cls in (Crooked, NotJson, Loose):
        queue.register(job_cls)
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.unique.crooked': its unique key function raised KeyErr"):
        queue.dispatch(Crooked(1))
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.unique.not_json': its unique key must be JSON"):
        queue.dispatch(NotJson(1))
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.unique.loose': .*'user_id' are not in its payload"):
        queue.dispatch(Loose(account=1))
    assert queue.pending_count() == 0
    assert not queue.dispatch(Loose(user_id=1)).duplicate


def test_unique_declarations_are_checked_where_they_are_written() -> None:
    with pytest.raises(TypeError, match=r"holds must be 'queued' or 'unfinished', got 'running'"):
        Unique("a", holds="running")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"give holds= or seconds=, not both"):
        Unique("a", holds="queued", seconds=5)
    with pytest.raises(TypeError, match=r"seconds must be a number > 0, got 0"):
        Unique("a", seconds=0)
    with pytest.raises(TypeError, match=r"give payload fields or a key function, not both"):
        Unique("a", key=lambda payload: 1)
    with pytest.raises(TypeError, match=r"fields are payload field names"):
        Unique(("a", "b"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"a field is named twice"):
        Unique("a", "a")
    with pytest.raises(TypeError, match=r"job class .*Bad: UNIQUE must be a syncjobs.Unique"):

        class Bad(syncjobs.Job):
            NAME = "tests.unique.bad"
            UNIQUE = ("user_id",)  # type: ignore[assignment]

    @dataclasses.dataclass
    class Misnamed(syncjobs.Job):
        NAME = "tests.unique.misnamed"
        UNIQUE = Unique("userid")
        user_id: int

        def run(self) -> None:
            pass

    with pytest.raises(TypeError, match=r"job class .*Misnamed: Unique\(\) names 'userid', not among \['user_id'\]"):
        syncjobs.InMemoryJobQueue(0).register(Misnamed)
    assert Unique("a") == Unique("a")
    assert Unique("a") != Unique("a", holds="unfinished")
    assert repr(Unique("a", seconds=30)) == "Unique('a', seconds=30)"


def test_a_unique_task_is_keyed_by_its_arguments_however_they_are_passed(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=0)

    @queue.task(name="tests.unique.refresh", unique=Unique("user_id", "full"))
    def refresh(user_id: int, note: str = "", full: bool = False) -> None:
        pass

    first = refresh.dispatch(4, "a")
    assert refresh.dispatch(user_id=4, note="b") == first  # full defaults to False in both
    assert refresh.dispatch(4, full=False) == first
    assert not refresh.dispatch(4, full=True).duplicate
    with pytest.raises(TypeError, match=r"task .*: Unique\(\) names 'account', not among \['user_id'\]"):

        @queue.task(name="tests.unique.typo", unique=Unique("account"))
        def typo(user_id: int) -> None:
            pass


def test_the_test_queue_records_a_duplicate_as_nothing_dispatched() -> None:
    app = syncjobs.InMemoryJobQueue(0)
    app.register(SyncUser)
    with TestQueue.diverting(app) as jobs:
        first = app.dispatch(SyncUser(1, "a"))
        assert app.dispatch(SyncUser(1, "b")) == first
        assert jobs.dispatched_of(SyncUser) == [{"user_id": 1, "reason": "a"}]
        jobs.run_all()
        assert app.dispatch(SyncUser(1, "c")) != first
        assert len(jobs.dispatched_of(SyncUser)) == 2


def test_an_in_memory_queue_forgets_the_keys_no_job_holds_as_they_grow(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=2)
    queue.start()
    handles = [queue.dispatch(SyncUser(n)) for n in range(3000)]
    for handle in handles[-10:]:
        handle.result(WAIT)
    wait_until(lambda: queue.pending_count() == 0)
    assert len({str(h) for h in handles}) == 3000
    assert all(not h.duplicate for h in handles)
    # Every key freed as its job began: a new dispatch of each is a new job.
    assert not any(queue.dispatch(SyncUser(n)).duplicate for n in range(0, 3000, 100))


# -- the database: one transaction, many processes, the schema ------------------------


@pytest.mark.parametrize("commit", [False, True])
def test_a_transactional_dispatch_takes_its_key_with_the_callers_transaction(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], commit: bool
) -> None:
    queue = syncjobs.DatabaseJobQueue(db_url, workers=0, table=TEST_TABLE, queue=f"q-{uuid.uuid4().hex[:8]}")
    queues.append(queue)
    queue.register(SyncUser)
    queue.install_schema()
    user = uuid.uuid4().int % 1_000_000_000
    conn = user_connection(db_url)
    try:
        inside = queue.dispatch(SyncUser(user, "inside"), connection=conn)
        assert queue.dispatch(SyncUser(user), connection=conn) == inside  # seen in the same transaction
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()
    after = queue.dispatch(SyncUser(user, "after"))
    assert (after == inside) is commit
    assert after.duplicate is commit
    assert queue.pending_count() == 1


def test_a_delayed_or_retrying_job_holds_a_key_held_while_queued(make_queue: QueueFactory) -> None:
    queue = _queue(make_queue, workers=0)
    later = queue.dispatch(SyncUser(11), delay=3600)
    status = later.status()
    assert status is not None
    assert status.state == "scheduled"
    assert queue.dispatch(SyncUser(11)) == later


def test_each_queue_of_a_table_has_its_own_keys(db_url: str, queues: list[syncjobs.DatabaseJobQueue]) -> None:
    one, two = (
        syncjobs.DatabaseJobQueue(db_url, workers=0, table=TEST_TABLE, queue=f"q-{uuid.uuid4().hex[:8]}")
        for _ in range(2)
    )
    queues.extend([one, two])
    for queue in (one, two):
        queue.register(SyncUser)
    first = one.dispatch(SyncUser(5))
    assert not two.dispatch(SyncUser(5)).duplicate
    assert one.dispatch(SyncUser(5)) == first


def test_a_callers_mysql_connection_that_counts_found_rows_still_sees_duplicates(
    queues: list[syncjobs.DatabaseJobQueue],
) -> None:
    """Django's MySQL connections (and SQLAlchemy's) say an upsert that changed nothing matched a row."""
    import pymysql.constants.CLIENT

    url = _reachable("mysql", SERVER_URLS["mysql"])
    queue = syncjobs.DatabaseJobQueue(url, workers=0, table=TEST_TABLE, queue=f"q-{uuid.uuid4().hex[:8]}")
    queues.append(queue)
    queue.register(SyncUser)
    queue.install_schema()
    conn = Connector(url, {"client_flag": pymysql.constants.CLIENT.FOUND_ROWS}).connect()
    try:
        conn.autocommit(False)
        first = queue.dispatch(SyncUser(3), connection=conn)
        assert queue.dispatch(SyncUser(3), connection=conn) == first
        conn.commit()
        again = queue.dispatch(SyncUser(3), connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert again == first
    assert again.duplicate
    assert queue.pending_count() == 1


def test_a_waiting_holder_does_not_begin_before_the_duplicates_transaction_commits(
    server_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    """A duplicate says "the waiting job will do it": that job must then run after what the caller's
    transaction changed, so it is not claimed until that transaction ends (SQLite's write lock
    keeps every claim out anyway)."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    queue = syncjobs.DatabaseJobQueue(server_url, workers=1, table=TEST_TABLE, queue=name, poll_interval=0.2)
    queues.append(queue)
    for job_cls in CLASSES:
        queue.register(job_cls)
    holder = queue.dispatch(SyncUser(21, "holder"))
    conn = user_connection(server_url)
    try:
        assert queue.dispatch(SyncUser(21, "the change"), connection=conn) == holder
        queue.start()
        after = queue.dispatch(Plain(1))  # queued after the holder: claimed once the holder was passed over
        wait_until(lambda: (s := after.status()) is not None and s.state == "done", what="the later job")
        status = holder.status()
        assert status is not None
        assert status.state == "queued"
        conn.commit()
    finally:
        conn.close()
    assert holder.result(WAIT) == 21


def test_dispatch_many_takes_each_key_once_against_the_table_and_within_the_batch(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    queue = syncjobs.DatabaseJobQueue(db_url, workers=0, table=TEST_TABLE, queue=f"q-{uuid.uuid4().hex[:8]}")
    queues.append(queue)
    queue.register(SyncUser)
    queue.register(Plain)
    base = uuid.uuid4().int % 1_000_000_000
    held = queue.dispatch(SyncUser(base))
    handles = queue.dispatch_many(
        [SyncUser(base + 1), SyncUser(base), Plain(1), SyncUser(base + 1, "again"), SyncUser(base + 2)]
    )
    assert [h.duplicate for h in handles] == [False, True, False, True, False]
    assert handles[1] == held
    assert handles[3] == handles[0]
    assert len({str(h) for h in handles}) == 4
    assert queue.pending_count() == 4  # held, base+1, Plain, base+2
    again = queue.dispatch_many([SyncUser(base + 2), SyncUser(base + 3)])
    assert again[0] == handles[4]
    assert again[0].duplicate
    assert not again[1].duplicate


def test_prune_forgets_the_keys_of_ended_jobs_and_keeps_the_held_ones(db_url: str) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, workers=0, table=table)  # never started: no housekeeping of its own
    for job_cls in CLASSES:
        queue.register(job_cls)
    try:
        cancelled = queue.dispatch(SyncUser(1))
        assert cancelled.cancel()
        done = queue.dispatch(SyncUser(2))
        execute(db_url, f"DELETE FROM {table} WHERE id = ?", (done.id,))  # as a done job's row is
        minute = queue.dispatch(SyncForAMinute(3))
        assert minute.cancel()  # held for its minute all the same
        waiting = queue.dispatch(SyncUser(4))
        assert queue.admin.prune(cancelled_older_than=3600).unique_keys == 2
        assert queue.dispatch(SyncUser(4)) == waiting
        assert queue.dispatch(SyncForAMinute(3)) == minute
        execute(db_url, f"UPDATE {table}_unique SET expires_at = expires_at - 61")
        assert queue.admin.prune(cancelled_older_than=3600).unique_keys == 1  # now the minute's
        assert execute(db_url, f"SELECT job_id FROM {table}_unique") == [(waiting.id,)]
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)


def test_the_workers_forget_the_keys_of_the_jobs_they_finish(db_url: str) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    # A short lease: the workers' housekeeping (lease recovery, pruning) comes every half lease.
    queue = syncjobs.DatabaseJobQueue(db_url, workers=1, table=table, lease=1.0, poll_interval=0.2)
    queue.register(SyncUser)
    try:
        with queue:
            handles = [queue.dispatch(SyncUser(n)) for n in range(5)]
            assert [h.result(WAIT) for h in handles] == list(range(5))
            wait_until(lambda: execute(db_url, f"SELECT COUNT(*) FROM {table}_unique") == [(0,)], what="keys pruned")
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)


def test_a_populated_version_6_table_gains_unique_keys_in_place(db_url: str) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, table=table, auto_schema=False, workers=1, poll_interval=0.2)
    queue.register(SyncUser)
    try:
        for statement in old_ddl(db_url, table, 6):
            execute(db_url, statement)
        execute(db_url, f"INSERT INTO {table}_schema (version) VALUES (6)")
        insert = (
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, 'default', 'tests.unique.sync_user', ?, 'queued', 0, 3, 0, 0)"
        )
        old = str(uuid.uuid4())
        execute(db_url, insert, (old, '{"user_id": 1, "reason": ""}'))
        with pytest.raises(syncjobs.QueueError, match=rf"version 6, this syncjobs needs {SCHEMA_VERSION}"):
            queue.start()
        planned = queue.admin.ddl()  # what `syncjobs migrate --sql` prints
        assert next(s for s in planned if f"{table}_unique" in s).startswith(
            f"CREATE TABLE IF NOT EXISTS {table}_unique"
        )
        added = [s for s in planned if s.startswith("ALTER TABLE") and " ADD " in s]
        assert [" traceback " in s for s in added] == [True], planned  # no new column but version 10's
        assert queue.admin.migrate() == 6  # the version it found
        assert queue.admin.schema_version() == SCHEMA_VERSION
        # A job queued before the upgrade took no key: the first unique dispatch after it does.
        first = queue.dispatch(SyncUser(1, "new"))
        assert not first.duplicate
        assert queue.dispatch(SyncUser(1)) == first
        queue.start()
        assert first.result(WAIT) == 1
        wait_until(lambda: queue.pending_count() == 0)
        assert sorted(STARTED) == sorted([old, first.id])
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)


def _dispatchers(url: str, table: str, *, user: int, processes: int, threads: int, each: int) -> list[str]:
    """``processes`` processes of ``threads`` threads each dispatch SyncUser(user) ``each`` times, all at once."""
    command = [
        sys.executable,
        "-m",
        "tests.unique_dispatcher",
        url,
        table,
        str(user),
        str(threads),
        str(each),
    ]
    started = [
        subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    try:
        for process in started:  # every process connected, every thread waiting
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        for process in started:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [process.communicate(timeout=90)[0] for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert all(process.returncode == 0 for process in started), outputs
    return [line for output in outputs for line in output.split()]


@pytest.mark.heavy
def test_many_processes_dispatching_one_key_at_once_make_exactly_one_job(db_url: str) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    install_tables(db_url, table)
    queue = syncjobs.DatabaseJobQueue(db_url, workers=0, table=table)
    queue.register(SyncUser)
    try:
        # A key no one has taken: 4 processes x 8 threads, 1,024 dispatches.
        got = _dispatchers(db_url, table, user=42, processes=4, threads=8, each=32)
        rows = execute(db_url, f"SELECT id FROM {table}")
        assert len(rows) == 1, rows
        assert len(got) == 1024
        assert set(got) == {rows[0][0]}
        # Its job cancelled, the key is free to take over: again exactly one takes it.
        assert queue.cancel(str(rows[0][0]))
        again = _dispatchers(db_url, table, user=42, processes=4, threads=8, each=32)
        waiting = execute(db_url, f"SELECT id FROM {table} WHERE state = 'queued'")
        assert len(waiting) == 1, waiting
        assert len(again) == 1024
        assert set(again) == {waiting[0][0]}
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)
