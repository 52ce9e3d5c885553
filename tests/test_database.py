"""What only the database backend promises: transactions, rows, processes, leases."""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import json
import logging
import random
import re
import signal
import sqlite3
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

import syncjobs
from syncjobs.database.dialects import SQLITE, Connector, dialect_for
from syncjobs.database.schema import COMPANIONS, SCHEMA_VERSION, ddl
from syncjobs.errors import JobFailed
from tests.conftest import JOB_CLASSES, TEST_TABLE
from tests.dbworker import Ledger, LedgerJob, OnceLedgerJob, Run, Workers, dispatch_ledger_jobs
from tests.faultproxy import FaultProxy, bounded
from tests.helpers import WAIT, OnceJob, Probe, ProbeJob, wait_until


def make(db_url: str, made: list[syncjobs.DatabaseJobQueue], **options: Any) -> syncjobs.DatabaseJobQueue:
    options.setdefault("queue", f"q-{uuid.uuid4().hex[:12]}")
    options.setdefault("poll_interval", 0.2)
    options.setdefault("table", TEST_TABLE)
    queue = syncjobs.DatabaseJobQueue(db_url, **options)
    for job_cls in (*JOB_CLASSES, LedgerJob):
        queue.register(job_cls)
    made.append(queue)
    return queue


def user_connection(url: str) -> Any:
    """A connection as the app would open it: the driver's defaults, a transaction per unit of work."""
    connector = Connector(url)
    if connector.dialect is SQLITE:
        return sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
    conn = connector.connect()
    if hasattr(conn, "autocommit") and not callable(conn.autocommit):
        conn.autocommit = False  # psycopg
    else:
        conn.autocommit(False)  # PyMySQL
    return conn


def install_tables(url: str, table: str) -> None:
    """Create the queue's tables under ``table``, as ``syncjobs migrate`` does."""
    queue = syncjobs.DatabaseJobQueue(url, table=table, workers=0)
    try:
        queue.install_schema()
    finally:
        queue.shutdown()


def drop_tables(url: str, table: str) -> None:
    for suffix in ("", *COMPANIONS):
        execute(url, f"DROP TABLE IF EXISTS {table}{suffix}")


def old_ddl(url: str, table: str, version: int) -> list[str]:
    """The statements an earlier schema version ran (each version only added to what was there)."""
    added = {
        2: ("_workers", "_done"),
        3: ("_finished",),
        4: ("_results",),
        7: ("_unique",),
        8: ("_schedules",),
        9: ("_limits", "_permits"),
    }
    later = [suffix for since, suffixes in added.items() if since > version for suffix in suffixes]
    statements = [s for s in ddl(dialect_for(url), table) if not any(f"{table}{suffix} " in s for suffix in later)]
    statements = [s for s in statements if not any(f"{table}{suffix}_" in s for suffix in later)]
    if version < 4:
        column = f",\n        started_at {dialect_for(url).real}"
        statements = [s.replace(column, "") for s in statements]
    if version < 5:  # the results table's payload (the jobs table's is NOT NULL)
        statements = [re.sub(r",\n        payload (LONG)?TEXT(?=[,\n])", "", s) for s in statements]
    if version < 6:  # priority, and the claim's index on it
        statements = [re.sub(r",\n        priority INTEGER( NOT NULL DEFAULT 0)?(?=[,\n])", "", s) for s in statements]
        # ... in place of the claim's index of versions 1 to 5, by due time.
        statements = [s.replace(f"{table}_ready", f"{table}_claim") for s in statements]
        statements = [s.replace("queue, state, priority DESC, run_at", "queue, state, run_at") for s in statements]
    if version < 10:  # where a dead job's last run raised
        statements = [re.sub(r",\n        traceback (LONG)?TEXT(?=[,\n])", "", s) for s in statements]
    return statements


def columns(url: str, table: str) -> list[str]:
    conn = Connector(url).connect()
    try:
        cursor = conn.cursor()
        cursor.execute(f"SELECT * FROM {table} WHERE 1 = 0")
        names = [str(column[0]) for column in cursor.description]
        cursor.close()
        return names
    finally:
        conn.close()


def execute(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = Connector(url).connect()
    try:
        cursor = conn.cursor()
        cursor.execute(sql.replace("?", Connector(url).dialect.placeholder), params)
        rows = list(cursor.fetchall()) if cursor.description else []
        cursor.close()
        return rows
    finally:
        conn.close()


# -- transactional enqueue ---------------------------------------------------


@pytest.mark.parametrize("commit", [False, True])
def test_dispatch_joins_the_callers_transaction(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], commit: bool
) -> None:
    queue = make(db_url, queues)
    queue.install_schema()
    execute(db_url, "CREATE TABLE IF NOT EXISTS syncjobs_test_orders (id VARCHAR(40))")
    order = uuid.uuid4().hex
    probe = Probe()
    conn = user_connection(db_url)
    try:
        cursor = conn.cursor()
        mark = Connector(db_url).dialect.placeholder
        cursor.execute(f"INSERT INTO syncjobs_test_orders (id) VALUES ({mark})", (order,))
        queue.dispatch(ProbeJob(probe.id), connection=conn)
        cursor.close()
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()
    orders = execute(db_url, "SELECT id FROM syncjobs_test_orders WHERE id = ?", (order,))
    assert len(orders) == (1 if commit else 0)
    assert queue.pending_count() == (1 if commit else 0)
    with queue:
        assert queue.join(WAIT)
    assert len(probe.runs) == (1 if commit else 0)


def test_dispatch_many_is_all_or_nothing(db_url: str, queues: list[syncjobs.DatabaseJobQueue]) -> None:
    @dataclasses.dataclass
    class Loose(syncjobs.Job):
        NAME = "tests.loose"
        value: object = None

    queue = make(db_url, queues)
    queue.register(Loose)
    with pytest.raises(syncjobs.QueueError, match=r"'tests\.loose'.*field 'value' is a set"):
        queue.dispatch_many([Loose(1), Loose({1}), Loose(3)])
    assert queue.pending_count() == 0
    ids = queue.dispatch_many([Loose(n) for n in range(50)])
    assert len(set(ids)) == 50
    assert queue.pending_count() == 50


# -- rows that cannot run, and the dead-letter rows ------------------------------


def test_malformed_rows_become_dead_letters_and_the_worker_goes_on(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    # unknown_job_wait=0: a NAME nothing registers is a dead letter at once (rolling deploys have tests of their own).
    queue = make(db_url, queues, workers=2, unknown_job_wait=0)
    queue.install_schema()
    bad = (
        [("tests.probe", "{not json")] * 70
        + [("tests.probe", "[1, 2]")] * 10
        + [("tests.probe", "[" * 20000 + "]" * 20000)] * 5  # nested too deeply to decode
        + [("tests.nobody_registered_this", '{"probe": "x"}')] * 70
        + [("tests.probe", '{"probe": "x", "no_such_field": 1}')] * 60
    )
    insert = (
        f"INSERT INTO {TEST_TABLE} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
        "VALUES (?, ?, ?, ?, 'queued', 0, 5, 0, 0)"
    )
    ids = [str(uuid.uuid4()) for _ in bad]
    for job_id, (name, payload) in zip(ids, bad, strict=True):
        execute(db_url, insert, (job_id, queue.queue_name, name, payload))
    good = Probe()
    queue.dispatch(ProbeJob(good.id))
    handed: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(handed.append)
    with queue:
        assert queue.join(WAIT * 3)
    assert len(good.runs) == 1
    letters = queue.dead_letters(limit=500)
    reasons = Counter(d.error.split(":")[0] + ":" + d.error.split(":")[1][:30] for d in letters)
    assert len(letters) == 215, reasons
    assert sum("payload does not fit" in d.error and "JSONDecodeError" in d.error for d in letters) == 70
    assert sum("payload must be a JSON object, got list" in d.error for d in letters) == 10
    # A payload that is not a JSON object shows as {}, in the rows and to the handlers alike.
    for dead in (letters, handed):
        assert Counter(json.dumps(d.payload, sort_keys=True) for d in dead) == {
            "{}": 85,
            '{"probe": "x"}': 70,
            '{"no_such_field": 1, "probe": "x"}': 60,
        }
    assert sum("no job class is registered as 'tests.nobody_registered_this'" in d.error for d in letters) == 70
    assert sum("unexpected keyword argument 'no_such_field'" in d.error for d in letters) == 60
    assert all(d.attempts == 0 for d in letters)
    # Their status reads, the payload that cannot be decoded as None.
    for job_id in (ids[0], ids[80], ids[-1]):  # not JSON, nested too deeply, an unexpected field
        status = queue.status(job_id)
        assert status is not None
        assert status.state == "dead"
        with pytest.raises(JobFailed):
            queue.result(job_id, 0)
    assert [queue.status(ids[i]).payload for i in (0, 80, 75)] == [None, None, [1, 2]]  # type: ignore[union-attr]
    assert queue.status(ids[-1]).payload == {"probe": "x", "no_such_field": 1}  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_a_finder_supplies_the_class_of_a_name_the_worker_never_registered(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], caplog: pytest.LogCaptureFixture
) -> None:
    sender = make(db_url, queues, workers=0)
    probe, other = Probe(), Probe()
    found = sender.dispatch(ProbeJob(probe.id))
    lost = sender.dispatch(OnceJob(other.id))
    worker = syncjobs.DatabaseJobQueue(
        db_url, table=TEST_TABLE, queue=sender.queue_name, workers=1, poll_interval=0.2, unknown_job_wait=0
    )  # registers nothing; a name it cannot find is a dead letter at once
    queues.append(worker)
    asked: list[str] = []

    def finder(name: str) -> type[syncjobs.Job] | None:
        asked.append(name)
        if name == ProbeJob.NAME:
            return ProbeJob
        raise RuntimeError("this finder breaks")

    worker.find_job_classes_with(finder)
    with worker:
        assert found.result(WAIT) is None
        with pytest.raises(JobFailed, match=r"no job class is registered as 'tests.once'"):
            lost.result(WAIT)
        assert worker.registered_names() == [ProbeJob.NAME]
        again = sender.dispatch(ProbeJob(probe.id))
        assert again.result(WAIT) is None
        lost_again = sender.dispatch(OnceJob(other.id))
        with pytest.raises(JobFailed, match=r"no job class is registered as 'tests.once'"):
            lost_again.result(WAIT)
    assert (len(probe.runs), len(other.runs)) == (2, 0)
    # A found class is registered; a name not found is not looked for again for a while (a look may import).
    assert asked == [ProbeJob.NAME, OnceJob.NAME]
    assert "finding the job class for NAME 'tests.once' failed" in caplog.text


@pytest.mark.timeout(60)
def test_a_job_an_old_worker_has_no_class_for_waits_unrun_for_one_that_has(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], caplog: pytest.LogCaptureFixture
) -> None:
    sender = make(db_url, queues, workers=0)
    probe = Probe()
    handle = sender.dispatch(OnceJob(probe.id))
    # The old worker of a rolling deploy: it registers nothing.
    old = syncjobs.DatabaseJobQueue(
        db_url, table=TEST_TABLE, queue=sender.queue_name, workers=1, poll_interval=0.2, unknown_job_wait=20
    )  # it looks again every 2 s (a tenth of the wait)
    queues.append(old)
    with caplog.at_level(logging.INFO, logger="syncjobs"), old:
        wait_until(lambda: f"job tests.once ({handle}): no job class is registered" in caplog.text, WAIT)
    status = handle.status()
    assert status is not None
    # Back in the queue (due in 2 s, or due already on a slow machine), its attempt unspent.
    assert status.state in ("scheduled", "queued"), status
    assert status.attempts == 0
    assert probe.runs == []
    new = make(db_url, queues, workers=1, queue=sender.queue_name)
    with new:
        assert handle.result(WAIT) is None
    assert len(probe.runs) == 1
    assert handle.status().attempts == 1  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_a_job_no_worker_has_a_class_for_is_a_dead_letter_without_a_run_once_the_wait_is_over(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], caplog: pytest.LogCaptureFixture
) -> None:
    sender = make(db_url, queues, workers=0)
    # Due 1.5 s after its dispatch, past the wait: it is still waited for, from when a worker first meets it.
    lost = sender.dispatch(OnceJob(Probe().id), delay=1.5)
    worker = syncjobs.DatabaseJobQueue(
        db_url, table=TEST_TABLE, queue=sender.queue_name, workers=1, poll_interval=0.2, unknown_job_wait=1
    )
    queues.append(worker)  # registers nothing
    with caplog.at_level(logging.INFO, logger="syncjobs"), worker, pytest.raises(JobFailed):
        lost.result(WAIT)
    assert f"job tests.once ({lost}): no job class is registered as 'tests.once' here; handed back unrun" in (
        caplog.text
    )
    status = lost.status()
    assert status is not None
    assert (status.state, status.attempts) == ("dead", 0)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"job tests.once ({lost}) is a")]
    assert line == (
        f"job tests.once ({lost}) is a dead letter without a run: "
        "cannot be run: no job class is registered as 'tests.once', and no worker that has one took it within 1s"
    )
    with pytest.raises(ValueError, match="unknown_job_wait must be a number of seconds >= 0"):
        syncjobs.DatabaseJobQueue(db_url, table=TEST_TABLE, unknown_job_wait=-1)


def test_dead_letters_stay_as_rows_to_inspect_retry_and_purge(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    queue = make(db_url, queues)
    probe = Probe("fatal")
    with queue:
        first = queue.dispatch(ProbeJob(probe.id, label=1))
        second = queue.dispatch(ProbeJob(probe.id, label=2))
        assert queue.join(WAIT)
        letters = queue.dead_letters()
        assert {(d.job_id, d.attempts, d.error) for d in letters} == {
            (first, 1, "fatal: nope"),
            (second, 1, "fatal: nope"),
        }
        assert {d.payload["label"] for d in letters} == {1, 2}
        probe.actions = ["ok"]
        assert queue.retry_dead(first) is True
        assert queue.retry_dead(first) is False  # no longer dead
        assert queue.retry_dead("no-such-id") is False
        assert queue.join(WAIT)
    assert [r["label"] for r in probe.runs] == [1, 2, 1] or sorted(r["label"] for r in probe.runs) == [1, 1, 2]
    assert [d.job_id for d in queue.dead_letters()] == [second]
    assert queue.purge_dead(older_than=3600) == 0
    assert queue.purge_dead() == 1
    assert queue.dead_letters() == []


def test_a_parked_retry_keeps_its_due_time_across_shutdown_and_restart(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    queue = make(db_url, queues, workers=1)
    probe = Probe("retryable", "ok", wait=60.0)

    def due_in() -> float:
        rows = execute(
            db_url,
            f"SELECT run_at - {Connector(db_url).dialect.now}, attempt FROM {TEST_TABLE} "
            "WHERE queue = ? AND state = 'queued'",
            (queue.queue_name,),
        )
        assert [attempt for _, attempt in rows] == [1]
        return float(rows[0][0])

    with queue:
        queue.dispatch(ProbeJob(probe.id))
        probe.wait_finished(1)
        wait_until(
            lambda: (
                queue.pending_count() == 1
                and bool(
                    execute(
                        db_url, f"SELECT id FROM {TEST_TABLE} WHERE queue = ? AND state = 'queued'", (queue.queue_name,)
                    )
                )
            ),
            what="the retry to be parked",
        )
    assert 55 < due_in() <= 60
    with queue:  # a restart does not run it early
        assert queue.join(timeout=0.5) is False
    assert 54 < due_in() <= 60
    assert probe.attempts == [0]


# -- context carried between processes ------------------------------------------

tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="no-tenant")
locale: contextvars.ContextVar[str] = contextvars.ContextVar("locale", default="en")


def test_only_the_carried_variables_travel(db_url: str, queues: list[syncjobs.DatabaseJobQueue]) -> None:
    seen: list[tuple[str, str]] = []

    @dataclasses.dataclass
    class Where(syncjobs.Job):
        NAME = "tests.where"

        def run(self) -> None:
            seen.append((tenant.get(), locale.get()))

    queue = make(db_url, queues, carry=[tenant])
    queue.register(Where)
    tenant_token, locale_token = tenant.set("acme"), locale.set("fr")
    try:
        queue.dispatch(Where())
    finally:
        tenant.reset(tenant_token)
        locale.reset(locale_token)
    with queue:
        assert queue.join(WAIT)
    assert seen == [("acme", "en")]


def test_a_carried_value_that_is_not_json_is_refused(db_url: str, queues: list[syncjobs.DatabaseJobQueue]) -> None:
    queue = make(db_url, queues, carry=[tenant])
    token = tenant.set(object())  # type: ignore[arg-type]
    try:
        with pytest.raises(syncjobs.QueueError, match="carried context variables must be JSON-serializable"):
            queue.dispatch(ProbeJob(Probe().id))
    finally:
        tenant.reset(token)
    assert queue.pending_count() == 0


# -- schema, names, drivers ------------------------------------------------------------


def test_install_schema_is_idempotent_and_versioned(db_url: str, queues: list[syncjobs.DatabaseJobQueue]) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, table=table)
    queues.append(queue)
    try:
        assert queue.admin.migrate() is None  # there was no table
        assert queue.admin.migrate() == SCHEMA_VERSION
        queue.install_schema()
        assert execute(db_url, f"SELECT version FROM {table}_schema") == [(SCHEMA_VERSION,)]
        assert queue.pending_count() == 0
    finally:
        drop_tables(db_url, table)


def test_a_version_1_table_is_upgraded_and_a_newer_one_refused(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, table=table, auto_schema=False)
    queues.append(queue)
    try:
        # What version 1 created: the jobs table and the version table only.
        for statement in old_ddl(db_url, table, 1):
            execute(db_url, statement)
        execute(db_url, f"INSERT INTO {table}_schema (version) VALUES (1)")
        assert "started_at" not in columns(db_url, table)
        with pytest.raises(
            syncjobs.QueueError, match=rf"version 1, this syncjobs needs {SCHEMA_VERSION}: run `syncjobs migrate"
        ):
            queue.start()
        assert queue.admin.migrate() == 1
        assert execute(db_url, f"SELECT version FROM {table}_schema") == [(SCHEMA_VERSION,)]
        assert execute(db_url, f"SELECT COUNT(*) FROM {table}_workers") == [(0,)]
        assert execute(db_url, f"SELECT COUNT(*) FROM {table}_results") == [(0,)]
        assert "started_at" in columns(db_url, table)
        queue.start()  # now it may
        queue.shutdown()
        execute(db_url, f"UPDATE {table}_schema SET version = 99")
        with pytest.raises(syncjobs.QueueError, match="schema version 99, newer than this syncjobs knows"):
            queue.admin.migrate()
    finally:
        drop_tables(db_url, table)


def test_a_populated_version_9_table_gains_its_traceback_column_in_place(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, table=table, auto_schema=False, workers=1, poll_interval=0.2)
    queues.append(queue)
    queue.register(OnceJob)
    try:
        for statement in old_ddl(db_url, table, 9):
            execute(db_url, statement)
        execute(db_url, f"INSERT INTO {table}_schema (version) VALUES (9)")
        assert "traceback" not in columns(db_url, table)
        execute(
            db_url,
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at, "
            "error, finished_at) VALUES ('old-dead', 'default', 'tests.once', '{}', 'dead', 1, 1, 0, 0, 'boom', 1)",
        )
        assert queue.admin.migrate() == 9
        assert "traceback" in columns(db_url, table)
        old = queue.status("old-dead")
        assert old is not None
        assert (old.state, old.error, old.traceback) == ("dead", "boom", None)
        probe = Probe("crash")
        with queue:
            job_id = queue.dispatch(OnceJob(probe.id))
            wait_until(lambda: getattr(queue.status(job_id), "state", None) == "dead", what="a dead letter")
        status = queue.status(job_id)
        assert status is not None
        assert status.traceback is not None
        assert status.traceback.rstrip().endswith("ValueError: boom")
    finally:
        drop_tables(db_url, table)


@pytest.mark.parametrize("table", ["jobs; DROP TABLE x", "1jobs", "", "a" * 64, "jobs-table"])
def test_a_table_name_that_is_not_an_identifier_is_refused(table: str) -> None:
    with pytest.raises(syncjobs.QueueError, match=r"table .* is not a valid name"):
        syncjobs.DatabaseJobQueue("sqlite:///unused.db", table=table)


def test_a_table_name_leaves_room_for_its_companions() -> None:
    syncjobs.DatabaseJobQueue("sqlite:///unused.db", table="t" * 54)
    with pytest.raises(syncjobs.QueueError, match=r"too long: at most 54 characters"):
        syncjobs.DatabaseJobQueue("sqlite:///unused.db", table="t" * 55)


def test_a_queue_name_is_checked_and_only_ever_bound() -> None:
    with pytest.raises(syncjobs.QueueError, match="queue name '' must be 1 to 100 printable characters"):
        syncjobs.DatabaseJobQueue("sqlite:///unused.db", queue="")


def test_a_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def without_drivers(name: str, *args: Any) -> Any:
        if name in ("psycopg", "pymysql"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_drivers)
    with pytest.raises(
        syncjobs.QueueError,
        match=r"install syncjobs' 'postgres' extra \(from a checkout, pip install '\.\[postgres\]'\)",
    ):
        syncjobs.DatabaseJobQueue("postgresql://db/app")
    with pytest.raises(
        syncjobs.QueueError, match=r"install syncjobs' 'mysql' extra \(from a checkout, pip install '\.\[mysql\]'\)"
    ):
        syncjobs.DatabaseJobQueue("mysql://db/app")


def test_settings_and_connect_pick_the_backend(database_urls: dict[str, str]) -> None:
    url = database_urls["sqlite"]
    assert isinstance(syncjobs.from_settings({"backend": "sqlite", "url": url}), syncjobs.DatabaseJobQueue)
    assert isinstance(syncjobs.connect(url, workers=1), syncjobs.DatabaseJobQueue)
    assert syncjobs.PgJobQueue is syncjobs.DatabaseJobQueue
    with pytest.raises(syncjobs.QueueError, match="the sqlite backend needs a 'url'"):
        syncjobs.from_settings({"backend": "sqlite"})
    with pytest.raises(syncjobs.QueueError, match="url 'mysql://x/y' is for another database"):
        syncjobs.from_settings({"backend": "postgresql", "url": "mysql://x/y"})


# -- many processes ----------------------------------------------------------------------


def dispatcher(db_url: str, made: list[syncjobs.DatabaseJobQueue]) -> tuple[syncjobs.DatabaseJobQueue, str]:
    """A queue that only dispatches (the worker processes run the jobs), and its name."""
    queue = make(db_url, made, workers=0)
    queue.install_schema()
    return queue, queue.queue_name


def test_four_processes_share_the_jobs_each_run_once_and_nothing_reports_a_lock(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], ledger: Ledger
) -> None:
    # SQLite: 4 processes x 2 threads, 5,000 jobs, the issue's own check that
    # "database is locked" never reaches the user; the servers: 2,000 jobs.
    count = 5000 if db_url.startswith("sqlite") else 2000
    queue, name = dispatcher(db_url, queues)
    workers = Workers(db_url, name, workers=2)
    try:
        for _ in range(4):
            workers.spawn()
        for start in range(0, count, 500):  # dispatched while the workers claim
            queue.dispatch_many([LedgerJob(name, n) for n in range(start, start + 500)])
        assert queue.join(180)
    finally:
        logs = workers.stop()
    runs = ledger.runs(name)
    assert Counter(n for n, _, _ in runs) == Counter(range(count))
    assert len({pid for _, _, pid in runs}) > 1
    reported = [line for log in logs for line in log.splitlines() if "locked" in line.lower() or "ERROR" in line]
    assert reported == []


def wait_marked(db_url: str, job_id: str) -> None:
    """Until the row of a started run is ``running`` (the fetcher marks a run that has lasted ``mark_after``)."""
    sql = f"SELECT state FROM {TEST_TABLE} WHERE id = ?"
    wait_until(lambda: execute(db_url, sql, (job_id,)) == [("running",)], what=f"job {job_id} to be marked running")


def test_a_killed_workers_job_runs_again_once_its_lease_expires(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], ledger: Ledger
) -> None:
    queue, name = dispatcher(db_url, queues)
    first = Workers(db_url, name, workers=1, lease=1.0)
    # The survivor keeps its lease through its run: renewed every third of it, 2 s outlast a busy machine's stalls.
    second = Workers(db_url, name, workers=1, lease=2.0)
    try:
        victim = first.spawn()
        (job_id,) = dispatch_ledger_jobs(queue, name, 1, seconds=60.0)
        wait_until(lambda: len(ledger.runs(name)) == 1, what="the job to start in the first process")
        wait_marked(db_url, job_id)
        victim.send_signal(signal.SIGKILL)
        victim.wait(WAIT)
        survivor = second.spawn()
        assert queue.join(WAIT * 3)
    finally:
        first.stop()
        second.stop()
    assert ledger.runs(name) == [(0, 0, victim.pid), (0, 1, survivor.pid)]


def test_a_job_whose_worker_dies_on_its_last_attempt_is_a_dead_letter(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], ledger: Ledger
) -> None:
    queue, name = dispatcher(db_url, queues)
    queue.register(OnceLedgerJob)
    first = Workers(db_url, name, workers=1, lease=1.0)
    second = Workers(db_url, name, workers=1, lease=1.0)
    try:
        victim = first.spawn()
        (job_id,) = queue.dispatch_many([OnceLedgerJob(name, 0, seconds=60.0)])
        wait_until(lambda: len(ledger.runs(name)) == 1, what="the only run to start")
        wait_marked(db_url, job_id)
        victim.send_signal(signal.SIGKILL)
        victim.wait(WAIT)
        second.spawn()
        assert queue.join(WAIT * 3)
    finally:
        first.stop()
        second.stop()
    assert ledger.runs(name) == [(0, 0, victim.pid)]
    assert [(d.job_id, d.attempts, d.error) for d in queue.dead_letters()] == [
        (job_id, 1, "lease expired on its last attempt (1 of 1): its worker died or stalled")
    ]


def test_a_stale_worker_cannot_finish_a_row_it_lost(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], ledger: Ledger
) -> None:
    queue, name = dispatcher(db_url, queues)
    stale_side = Workers(db_url, name, workers=1, lease=1.0)
    other_side = Workers(db_url, name, workers=1, lease=1.0)
    try:
        stale = stale_side.spawn()
        # Run 0 works for 3 s, then succeeds; any later run fails for good.
        (job_id,) = dispatch_ledger_jobs(queue, name, 1, seconds=3.0, fatal_on_retry=True)
        wait_until(lambda: len(ledger.runs(name)) == 1, what="the first run to start")
        wait_marked(db_url, job_id)
        stale.send_signal(signal.SIGSTOP)  # frozen past its lease: no heartbeat
        other = other_side.spawn()
        wait_until(lambda: [d.job_id for d in queue.dead_letters()] == [job_id], what="the re-claimed run to fail")
        stale.send_signal(signal.SIGCONT)  # its run 0 now finishes "successfully"
        logs = stale_side.stop()
    finally:
        stale_side.stop()
        other_side.stop()
    assert ledger.runs(name) == [(0, 0, stale.pid), (0, 1, other.pid)]
    # The stale success did not delete the row the other worker dead-lettered.
    assert [(d.job_id, d.error) for d in queue.dead_letters()] == [(job_id, "fatal: second run")]
    assert "had lost their lease" in logs[0]


#: How long after a run's end its completion may still be unwritten (the completer batches them).
KILL_SLACK = 2.0


@pytest.mark.heavy
@pytest.mark.timeout(600)  # a turn may wait for the heavy tests of other suites (see conftest.py)
def test_chaos_killing_workers_loses_nothing_and_reruns_only_what_they_ran(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], ledger: Ledger
) -> None:
    queue, name = dispatcher(db_url, queues)
    # A lease of 3 s: long enough that a live worker's heartbeat (every 1 s)
    # keeps it on this loaded 2-core machine, short enough for the 20 s run.
    workers = Workers(db_url, name, workers=2, lease=3.0)
    rng = random.Random(1234)
    killed: dict[int, float] = {}  # pid: when it was killed (time.time(), the ledger's clock)
    try:
        live = [workers.spawn() for _ in range(4)]
        dispatch_ledger_jobs(queue, name, 5000, seconds=0.03)
        chaos_ends = time.monotonic() + 20
        while time.monotonic() < chaos_ends and queue.pending_count():
            pause = threading.Event()
            pause.wait(2.0)  # the chaos schedule: one kill every 2 s
            victim = live.pop(rng.randrange(len(live)))
            victim.send_signal(signal.SIGKILL)
            victim.wait(WAIT)
            # When it is reaped, not before the signal: until the signal lands it may start a job.
            killed[victim.pid] = time.time()
            live.append(workers.spawn())
        assert queue.join(180)
    finally:
        workers.stop()
    by_job: dict[int, list[Run]] = {}
    for run in ledger.details(name):
        by_job.setdefault(run.n, []).append(run)
    assert sorted(by_job) == list(range(5000))
    assert killed, "the chaos run killed nobody"
    for n, job_runs in by_job.items():
        *repeated, last = sorted(job_runs, key=lambda run: run.started)
        assert last.ended is not None, (n, job_runs)
        # Every run but the last was cut short by a kill: its process died
        # while it ran, or before its completion was written (in the
        # completer's next batch, within KILL_SLACK of the run's end).
        for run in repeated:
            kill = killed.get(run.pid)
            assert kill is not None, (n, job_runs, killed)
            assert run.started < kill, (n, job_runs, killed)
            assert run.ended is None or run.ended > kill - KILL_SLACK, (n, job_runs, killed)
    assert queue.pending_count() == 0
    assert queue.dead_letters() == []


#: The fault tests' own table: what a fault leaves behind stays out of the other tests' way.
FAULT_TABLE = "syncjobs_fault_jobs"


@pytest.mark.parametrize("fault", ["refuse", "blackhole"])
def test_workers_ride_out_a_server_outage(
    server_url: str, proxy: FaultProxy, queues: list[syncjobs.DatabaseJobQueue], fault: str
) -> None:
    """The server goes away under running workers (through the suite's proxy, never the server itself).

    ``refuse``: every connection is reset and new ones are refused, as a server
    that is down; ``blackhole``: the path goes silent, nothing is reset. While
    it lasts a dispatch raises DatabaseUnavailable within its timeout (+ 1 s);
    once it ends every job runs, on the same worker threads, never restarted.
    """
    queue = make(proxy.url(server_url), queues, workers=2, dispatch_timeout=1.0, table=FAULT_TABLE)
    probe = Probe()
    with queue:
        workers = {thread.ident for thread in queue.worker_threads()}
        for label in range(200):
            queue.dispatch(ProbeJob(probe.id, label))
        probe.wait_finished(20)
        getattr(proxy, fault)()
        try:
            dispatch = bounded(lambda: queue.dispatch(ProbeJob(probe.id, 999)), limit=10.0)
            assert isinstance(dispatch.error, syncjobs.DatabaseUnavailable), dispatch
            assert "'tests.probe'" in str(dispatch.error)
            assert dispatch.seconds <= 1.0 + 1.0, dispatch
            # The outage outlasts the workers' retries of what was in flight.
            threading.Event().wait(3.0)
        finally:
            proxy.resume()
        queue.dispatch(ProbeJob(probe.id, 200))
        assert queue.join(60)
        assert {thread.ident for thread in queue.worker_threads()} == workers
    # Every job ran, at least once. A refused dispatch never reached the
    # server; one sent into a black hole may yet arrive when the path comes back.
    labels = {run["label"] for run in probe.runs}
    assert labels - {999} == set(range(201))
    if fault == "refuse":
        assert 999 not in labels
