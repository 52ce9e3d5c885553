"""What goes into the jobs table and how it comes out: poison rows, lost replies, sizes, prefetch, wake-ups."""

from __future__ import annotations

import dataclasses
import signal
import sqlite3
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import syncjobs
from syncjobs.database import queries
from syncjobs.database.dialects import SQLITE, Connector, dialect_for
from syncjobs.database.intake import Intake
from syncjobs.database.schema import SCHEMA_VERSION
from syncjobs.registry import Registry
from tests.conftest import SERVER_URLS, TEST_TABLE, _reachable
from tests.dbworker import KillerJob, Ledger, OnceLedgerJob
from tests.faultproxy import FaultProxy
from tests.helpers import WAIT, Probe, ProbeJob, wait_until
from tests.test_database import (
    Workers,
    dispatcher,
    drop_tables,
    execute,
    install_tables,
    make,
    old_ddl,
    user_connection,
    wait_marked,
)


def rows_of(url: str, queue: str) -> list[tuple[Any, ...]]:
    return execute(url, f"SELECT id, state FROM {TEST_TABLE} WHERE queue = ?", (queue,))


# -- poison rows --------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_rows_that_cannot_be_decoded_become_dead_letters_and_the_queue_goes_on(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    queue = make(db_url, queues, workers=2, lease=5.0)
    queue.install_schema()
    good = Probe()
    payload = f'{{"probe": "{good.id}"}}'
    queued = (
        f"INSERT INTO {TEST_TABLE} (id, queue, name, payload, context, state, attempt, max_attempts, run_at, "
        "created_at) VALUES (?, ?, 'tests.probe', ?, ?, 'queued', ?, ?, 0, 0)"
    )
    expired = (
        f"INSERT INTO {TEST_TABLE} (id, queue, name, payload, context, state, attempt, max_attempts, run_at, "
        "created_at, lease_owner, lease_token, lease_expires) "
        "VALUES (?, ?, 'tests.probe', ?, ?, ?, ?, ?, 0, 0, 'gone', 'gone', 0)"
    )
    # (context, attempt, max_attempts) and the reason expected, claimed and recovered alike.
    kinds: list[tuple[str | None, Any, Any, str]] = [
        (DEEP, 0, 3, "its carried context is nested too deeply to decode"),
        ("{not json", 0, 3, "its carried context is not JSON"),
        ("[1, 2]", 0, 3, "its carried context is not a JSON object (a list)"),
    ]
    if dialect_for(db_url) is SQLITE:
        # SQLite keeps what it is given, whatever the column's type.
        kinds += [
            (None, "one", 3, "its attempt is not a number: 'one'"),
            (None, 0, "three", "its max_attempts is not a number: 'three'"),
        ]
    expected: dict[str, str] = {}
    for context, attempt, max_attempts, reason in kinds:
        job_id = str(uuid.uuid4())
        execute(db_url, queued, (job_id, queue.queue_name, payload, context, attempt, max_attempts))
        expected[job_id] = reason
        for state in ("running", "claimed"):  # a dead worker's rows, its run started or not
            job_id = str(uuid.uuid4())
            params = (job_id, queue.queue_name, payload, context, state, attempt, max_attempts)
            execute(db_url, expired, params)
            expected[job_id] = reason
    if dialect_for(db_url) is SQLITE:
        job_id = str(uuid.uuid4())
        bad_text = (
            f"INSERT INTO {TEST_TABLE} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, ?, 'tests.probe', CAST(X'7B22FF227D' AS TEXT), 'queued', 0, 3, 0, 0)"
        )
        execute(db_url, bad_text, (job_id, queue.queue_name))
        expected[job_id] = "its payload is not valid UTF-8"
    handed: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(handed.append)
    ids = queue.dispatch_many([ProbeJob(good.id, label=n) for n in range(5)])
    with queue:
        good.wait_finished(5, timeout=WAIT * 2)
        assert queue.join(WAIT * 2)
    assert sorted(run["label"] for run in good.runs) == [0, 1, 2, 3, 4]
    letters = {d.job_id: d for d in queue.dead_letters(limit=100)}
    assert set(letters) == set(expected)
    for job_id, reason in expected.items():
        assert letters[job_id].error.startswith(f"this row cannot be run: {reason}"), letters[job_id].error
    assert {d.job_id for d in handed} == set(expected)
    assert not set(ids) & set(letters)


# -- dispatch whose reply is lost ------------------------------------------------------


@pytest.mark.parametrize("marker", [b"INSERT", b"COMMIT"])
def test_a_dispatch_whose_reply_is_lost_after_its_commit_returns_and_runs_once(
    server_url: str, proxy: FaultProxy, queues: list[syncjobs.DatabaseJobQueue], marker: bytes
) -> None:
    name = f"q-{uuid.uuid4().hex[:12]}"
    dispatching = make(proxy.url(server_url), queues, workers=0, queue=name, dispatch_timeout=WAIT)
    dispatching.install_schema()
    probe = Probe()
    proxy.lose_reply(marker)
    if marker == b"INSERT":  # one job: one autocommitted statement
        ids = [dispatching.dispatch(ProbeJob(probe.id))]
    else:  # several: one transaction, whose COMMIT's reply is lost
        ids = dispatching.dispatch_many([ProbeJob(probe.id, label=n) for n in range(3)])
    assert proxy.replies_lost == 1
    assert sorted(job_id for job_id, _ in rows_of(server_url, name)) == sorted(ids)
    running = make(server_url, queues, workers=2, queue=name)
    with running:
        assert running.join(WAIT)
    assert len(probe.runs) == len(ids)


def test_a_retried_dispatch_does_not_bring_back_a_job_that_already_ran(
    server_url: str, proxy: FaultProxy, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    name = f"q-{uuid.uuid4().hex[:12]}"
    dispatching = make(proxy.url(server_url), queues, workers=0, queue=name, dispatch_timeout=WAIT * 3)
    dispatching.install_schema()  # this thread's connection through the proxy is open
    running = make(server_url, queues, workers=1, queue=name)
    running.start()
    probe = Probe()

    def finish_then_resume() -> None:
        # The first try committed and its reply was lost; the retries are
        # refused until the job has run and its row is gone: the ordering
        # that would make a blind retry insert the finished job again.
        wait_until(lambda: len(probe.finished) == 1 and not rows_of(server_url, name), timeout=WAIT * 2)
        proxy.resume()

    proxy.refuse_new()
    proxy.lose_reply(b"INSERT")
    helper = threading.Thread(target=finish_then_resume)
    helper.start()
    try:
        job_id = dispatching.dispatch(ProbeJob(probe.id))
    finally:
        helper.join(WAIT * 3)
    assert proxy.replies_lost == 1
    assert rows_of(server_url, name) == []  # not inserted again
    assert running.join(WAIT)
    assert [run["attempt"] for run in probe.runs] == [0]
    assert job_id


# -- MySQL's packet limit ---------------------------------------------------------------


@dataclasses.dataclass
class Blob(syncjobs.Job):
    NAME = "tests.blob"
    data: str

    def run(self) -> None:
        pass


@pytest.mark.parametrize("server_url", ["mysql"], indirect=True)
def test_mysql_large_batches_are_split_under_the_packet_limit_and_a_job_over_it_refused(
    server_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    ((limit,),) = execute(server_url, "SELECT @@max_allowed_packet")
    limit = int(limit)
    if limit > 64 * 2**20:
        pytest.skip(f"max_allowed_packet is {limit} bytes: too large to exceed in a test")
    # Retries would go on for the whole dispatch_timeout: a refusal well within it came at once.
    queue = make(server_url, queues, workers=0, dispatch_timeout=30.0)
    queue.register(Blob)
    size = int(limit * 0.3)  # 4 of these are more than one packet; each fits
    ids = queue.dispatch_many([Blob(str(n) * size) for n in range(4)])
    assert queue.pending_count() == 4
    lengths = execute(server_url, f"SELECT id, LENGTH(payload) FROM {TEST_TABLE} WHERE queue = ?", (queue.queue_name,))
    assert sorted(job_id for job_id, _ in lengths) == sorted(ids)
    assert all(int(length) > size for _, length in lengths)
    began = time.monotonic()
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.blob' \(.*\) is too large .* max_allowed_packet of"):
        queue.dispatch_many([Blob("small"), Blob("x" * (limit + 1000))])
    assert time.monotonic() - began < 15.0  # refused before any retry, not after 30 s of them
    assert queue.pending_count() == 4  # all or nothing


# -- prefetched jobs and the attempts they spend --------------------------------------


def test_a_prefetched_row_waits_as_claimed_and_is_marked_running_once_taken(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    queue = make(db_url, queues, workers=1, prefetch=1)
    first, second = Probe("block"), Probe("block")
    with queue:
        (a,) = queue.dispatch_many([ProbeJob(first.id)])
        first.wait_runs(1)
        (b,) = queue.dispatch_many([ProbeJob(second.id)])
        wait_until(lambda: dict(rows_of(db_url, queue.queue_name)) == {a: "running", b: "claimed"})
        first.release.set()
        second.wait_runs(1)
        wait_until(lambda: dict(rows_of(db_url, queue.queue_name)) == {b: "running"}, what="the mark")
        second.release.set()
        assert queue.join(WAIT)


def test_a_row_put_back_unstarted_is_running_from_its_next_claim_on(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    # Its run may have started before its mark was written (a job that kills
    # its worker at once): the next run is counted whatever happens to it.
    queue = make(db_url, queues, workers=1, prefetch=1, lease=2.0)
    queue.install_schema()
    blocker, later = Probe("block"), Probe()
    job_id = str(uuid.uuid4())
    with queue:
        queue.dispatch(ProbeJob(blocker.id))
        blocker.wait_runs(1)
        execute(
            db_url,
            f"INSERT INTO {TEST_TABLE} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at, "
            "lease_owner, lease_token, lease_expires) VALUES (?, ?, 'tests.probe', ?, 'claimed', 0, 1, 0, 0, "
            "'gone', 'gone', 0)",
            (job_id, queue.queue_name, f'{{"probe": "{later.id}"}}'),
        )
        # Put back with no run spent, and claimed ahead of the busy worker as running.
        wait_until(lambda: dict(rows_of(db_url, queue.queue_name)).get(job_id) == "running", what="the re-claim")
        assert execute(db_url, f"SELECT attempt FROM {TEST_TABLE} WHERE id = ?", (job_id,)) == [(0,)]
        blocker.release.set()
        later.wait_runs(1)
        assert queue.join(WAIT)
    assert later.attempts == [0]


def test_prefetched_jobs_of_a_killed_worker_spend_no_attempt(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], ledger: Ledger
) -> None:
    queue, name = dispatcher(db_url, queues)
    queue.register(OnceLedgerJob)
    first = Workers(db_url, name, workers=1, lease=1.0)
    # The survivor's lease outlasts a busy machine's stalls: its single-attempt jobs must not lapse.
    second = Workers(db_url, name, workers=1, lease=2.0)
    try:
        victim = first.spawn()
        (started,) = queue.dispatch_many([OnceLedgerJob(name, 0, seconds=60.0)])
        wait_until(lambda: len(ledger.runs(name)) == 1, what="the first job to start")
        queue.dispatch_many([OnceLedgerJob(name, n) for n in range(1, 4)])

        def held() -> int:
            sql = f"SELECT COUNT(*) FROM {TEST_TABLE} WHERE queue = ? AND lease_owner IS NOT NULL"
            rows = execute(db_url, sql, (name,))
            return int(rows[0][0])

        wait_until(lambda: held() == 2, what="one more job to be claimed ahead")
        wait_marked(db_url, started)
        victim.send_signal(signal.SIGKILL)
        victim.wait(WAIT)
        second.spawn()
        assert queue.join(WAIT * 3)
    finally:
        first.stop()
        second.stop()
    runs = ledger.runs(name)
    # Every job ran once; the one whose run started (and died with its worker) spent its only attempt.
    assert Counter(n for n, _, _ in runs) == Counter(range(4))
    assert [(n, pid) for n, _, pid in runs if n == 0] == [(0, victim.pid)]
    assert [(d.job_id, d.error) for d in queue.dead_letters()] == [
        (started, "lease expired on its last attempt (1 of 1): its worker died or stalled")
    ]


@pytest.mark.timeout(120)
def test_a_job_that_kills_its_worker_ends_as_a_dead_letter(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], ledger: Ledger
) -> None:
    queue, name = dispatcher(db_url, queues)
    queue.register(KillerJob)
    workers = Workers(db_url, name, workers=2, lease=1.0)
    try:
        (job_id,) = queue.dispatch_many([KillerJob(name, 0)])
        kills = 0
        while kills < 10:
            # The job may kill this worker before it says it is ready.
            victim = workers.spawn(wait_ready=False)
            wait_until(lambda v=victim: v.poll() is not None or bool(queue.dead_letters()), timeout=WAIT)
            if victim.poll() is None:
                break  # the job is a dead letter: nothing killed this one
            kills += 1
    finally:
        workers.stop()
    assert [(d.job_id, d.error) for d in queue.dead_letters()] == [
        (job_id, "lease expired on its last attempt (2 of 2): its worker died or stalled")
    ]
    # Each run spent an attempt, at the latest on the run after it (see fetcher.py).
    assert 2 <= len(ledger.runs(name)) <= 4


# -- transactional dispatch wakes the fetcher after the commit -------------------------


@pytest.mark.parametrize("db_url", ["mysql"], indirect=True)
def test_mysql_a_transactional_dispatch_is_picked_up_soon_after_its_commit(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    # Picked up at the poll, it would start 10 s after the dispatch.
    queue = make(db_url, queues, workers=1, poll_interval=10.0)
    probe = Probe()
    with queue:
        conn = user_connection(db_url)
        try:
            queue.dispatch(ProbeJob(probe.id), connection=conn)
            # The rest of the caller's transaction: the fetcher, woken at
            # dispatch, finds nothing committed yet.
            threading.Event().wait(0.3)
            conn.commit()
            committed = time.monotonic()
        finally:
            conn.close()
        probe.wait_runs(1)
        assert probe.runs[0]["at"] - committed < 3.0
        assert queue.join(WAIT)


# -- the schema change ----------------------------------------------------------------


def test_a_populated_version_2_table_is_upgraded_in_place(db_url: str, queues: list[syncjobs.DatabaseJobQueue]) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    try:
        # What version 2 created: everything but the tombstones and what came later.
        for statement in old_ddl(db_url, table, 2):
            execute(db_url, statement)
        execute(db_url, f"INSERT INTO {table}_schema (version) VALUES (2)")
        old = syncjobs.DatabaseJobQueue(db_url, table=table, auto_schema=False, workers=1, poll_interval=0.2)
        queues.append(old)
        old.register(ProbeJob)
        probe = Probe()
        insert = (
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, 'default', 'tests.probe', ?, 'queued', 0, 3, 0, 0)"
        )
        ids = [str(uuid.uuid4()) for _ in range(3)]
        for job_id in ids:
            execute(db_url, insert, (job_id, f'{{"probe": "{probe.id}"}}'))
        with pytest.raises(syncjobs.QueueError, match=rf"version 2, this syncjobs needs {SCHEMA_VERSION}"):
            old.start()
        assert old.admin.migrate() == 2
        assert old.admin.migrate() == SCHEMA_VERSION  # again: nothing to do
        assert execute(db_url, f"SELECT version FROM {table}_schema") == [(SCHEMA_VERSION,)]
        assert sorted(job_id for (job_id,) in execute(db_url, f"SELECT id FROM {table}")) == sorted(ids)
        with old:
            assert old.join(WAIT)
        assert len(probe.runs) == 3
        finished = execute(db_url, f"SELECT id FROM {table}_finished")
        assert sorted(job_id for (job_id,) in finished) == sorted(ids)
    finally:
        drop_tables(db_url, table)


@pytest.mark.timeout(60)
def test_a_dispatch_refused_by_a_lock_tries_its_plain_insert_again(tmp_path: Any) -> None:
    """A try that met a lock wrote nothing: the next is the plain insert, not the slower idempotent one."""
    path = tmp_path / "jobs.db"
    url = f"sqlite:///{path}"
    install_tables(url, TEST_TABLE)
    sql = {name: SQLITE.sql(text, TEST_TABLE) for name, text in vars(queries).items() if name.isupper()}
    connector = Connector(url)
    intake = Intake(sql, SQLITE, lambda: "default", connector.is_contention)
    job = syncjobs.queue.new_envelope(_registry_of(ProbeJob), ProbeJob(Probe().id))
    insert = intake.operation(
        [(job, 0.0)], [(job.id, "default", job.name, job.payload, None, job.max_attempts, 0, 0.0)], own_transaction=True
    )
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    holder = sqlite3.connect(path, isolation_level=None)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process's writer
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            insert(conn.cursor())
        holder.execute("ROLLBACK")
        statements.clear()
        insert(conn.cursor())
    finally:
        conn.close()
        holder.close()
    # One autocommitted INSERT: no transaction, no ON CONFLICT, no look for a tombstone.
    assert len(statements) == 1, statements
    assert statements[0].startswith(f"INSERT INTO {TEST_TABLE} ("), statements
    assert "CONFLICT" not in statements[0], statements
    assert execute(url, f"SELECT id FROM {TEST_TABLE}") == [(job.id,)]


@pytest.mark.timeout(60)
def test_sqlite_dispatches_leave_the_wal_checkpoint_to_the_workers(tmp_path: Any) -> None:
    """Past SQLite's 1,000 WAL pages a dispatch does not copy them into the database: a worker's commit does."""
    path = tmp_path / "jobs.db"
    url = f"sqlite:///{path}"
    dispatcher = syncjobs.DatabaseJobQueue(url, table=TEST_TABLE, workers=0)
    dispatcher.register(ProbeJob)
    dispatcher.install_schema()
    probe = Probe()
    try:
        for label in range(1000):  # some 5 WAL pages each here: 1,500 pages even at 1.5
            dispatcher.dispatch(ProbeJob(probe.id, label))
        wal = Path(f"{path}-wal")
        page = 4096
        # Checkpointed at 1,000 pages, the WAL would start over from its beginning, and stay at that size.
        assert wal.stat().st_size > 1_500 * page, wal.stat().st_size
        unchecked = path.stat().st_size
        assert unchecked < 100 * page  # the rows are in the WAL only
        worker = syncjobs.DatabaseJobQueue(url, table=TEST_TABLE, workers=1)
        worker.register(ProbeJob)
        worker.start()
        try:
            probe.wait_finished(1000)
            wait_until(lambda: path.stat().st_size > unchecked, what="a worker's commit checkpointing the WAL")
        finally:
            worker.shutdown()
    finally:
        dispatcher.shutdown()
        drop_tables(url, TEST_TABLE)


def _registry_of(job_cls: type[syncjobs.Job]) -> Registry:
    registry = Registry()
    registry.register(job_cls)
    return registry


class _PausingCursor:
    """A cursor that stops after its first statement containing ``after`` until released."""

    def __init__(self, cursor: Any, after: str) -> None:
        self._cursor = cursor
        self._after = after
        self.paused = threading.Event()
        self.release = threading.Event()

    def execute(self, sql: str, params: Any = ()) -> Any:
        result = self._cursor.execute(sql, params)
        if self._after in sql and not self.paused.is_set():
            self.paused.set()
            assert self.release.wait(WAIT), "the test never released the cursor"
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _LostReply:
    """A cursor whose INSERT's reply never comes (the INSERT itself is not sent)."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params: Any = ()) -> Any:
        if sql.startswith("INSERT"):
            raise OSError("the connection dropped before the reply")
        return self._cursor.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


@pytest.mark.timeout(120)
def test_a_dispatch_tried_again_on_mysql_keeps_a_late_first_try_out_until_it_commits() -> None:
    # The check of a dispatch tried again takes gap locks on the ids it did
    # not find (REPEATABLE READ, the server's default, which the store keeps): a first try that
    # reaches the server late waits until the check's insert has committed,
    # and never slips in between. Under READ COMMITTED it would.
    server_url = _reachable("mysql", SERVER_URLS["mysql"])
    table = f"gap_{uuid.uuid4().hex[:10]}"
    install_tables(server_url, table)
    connector = Connector(server_url)
    dialect = connector.dialect
    sql = {name: dialect.sql(text, table) for name, text in vars(queries).items() if name.isupper()}
    intake = Intake(sql, dialect, lambda: "default", connector.is_contention)
    job = syncjobs.queue.new_envelope(_registry_of(ProbeJob), ProbeJob(Probe().id))
    row = (job.id, "default", job.name, job.payload, None, job.max_attempts, 0, 0.0)  # priority 0, no delay
    insert = intake.operation([(job, 0.0)], [row], own_transaction=True)
    store_conn, late = connector.connect(), connector.connect()
    try:
        with pytest.raises(OSError, match="dropped"):
            insert(_LostReply(store_conn.cursor()))  # ambiguous: the next try is the checking one
        late.cursor().execute("SET innodb_lock_wait_timeout = 1")
        cursor = _PausingCursor(store_conn.cursor(), after="FOR UPDATE")
        retry = threading.Thread(target=insert, args=(cursor,))
        retry.start()
        try:
            assert cursor.paused.wait(WAIT)
            with pytest.raises(Exception, match="Lock wait timeout") as refused:
                late.cursor().execute(intake.insert_sql(1), list(row))
            assert connector.is_contention(refused.value)
        finally:
            cursor.release.set()
            retry.join(WAIT)
        assert not retry.is_alive()
    finally:
        store_conn.close()
        late.close()
    try:
        assert execute(server_url, f"SELECT id FROM {table}") == [(job.id,)]
    finally:
        drop_tables(server_url, table)
