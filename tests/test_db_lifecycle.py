"""The database backend's lifecycle under faults: leases, outcome writes, shutdown, exit, --max-jobs."""

from __future__ import annotations

import sqlite3
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

import syncjobs
from syncjobs import worker
from syncjobs.database import background
from syncjobs.database.dialects import POSTGRES, SQLITE, dialect_for
from syncjobs.envelope import ClaimedEnvelope
from tests.conftest import SERVER_URLS, _reachable
from tests.faultproxy import FaultProxy
from tests.helpers import WAIT, Probe, ProbeJob, wait_until
from tests.test_cli import Sleepy, dispatch, rows, run
from tests.test_database import drop_tables, execute
from tests.test_processes import _communicate, _python

T = TypeVar("T")


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    name = f"life_{uuid.uuid4().hex[:10]}"
    yield name
    drop_tables(db_url, name)


@pytest.fixture
def made() -> Iterator[list[syncjobs.DatabaseJobQueue]]:
    queues: list[syncjobs.DatabaseJobQueue] = []
    yield queues
    for queue in queues:
        queue.shutdown(grace=0)


def make(url: str, table: str, made: list[syncjobs.DatabaseJobQueue], **options: Any) -> syncjobs.DatabaseJobQueue:
    options.setdefault("poll_interval", 0.2)
    queue = syncjobs.DatabaseJobQueue(url, table=table, **options)
    queue.register(ProbeJob)
    made.append(queue)
    return queue


def syncjobs_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("syncjobs")}


# -- item 21: --max-jobs counts at claim ---------------------------------------


def test_max_jobs_1_with_4_workers_runs_exactly_one_job(db_url: str, table: str) -> None:
    # Long enough that every worker has taken one before the first ends.
    dispatch(db_url, table, *(Sleepy(0.5) for _ in range(10)))
    code, out, err = run(
        "worker", "--url", db_url, "--table", table, "--import", "tests.cli_jobs", "--workers", "4", "--max-jobs", "1"
    )
    assert code == 0, err
    assert "max-jobs reached: stopping" in err
    assert out.count("started sleepy") == 1, out
    assert err.count(": done") == 1, err
    # The jobs other workers had claimed went back unrun: no attempt spent.
    assert sorted(rows(db_url, table)) == [("cli.sleepy", "queued", 0)] * 9


# -- item 6: the interpreter exits with a queue never shut down ------------------

_NEVER_SHUT_DOWN = """
import dataclasses, logging, sys, threading, syncjobs
logging.basicConfig(format="%(levelname)s %(message)s")
started = threading.Event()

@dataclasses.dataclass
class Slow(syncjobs.Job):
    NAME = "slow"
    def run(self):
        started.set()
        syncjobs.current_job().cancelled.wait(60)

queue = syncjobs.DatabaseJobQueue(sys.argv[1], table=sys.argv[2], workers=3, poll_interval=0.2)
queue.register(Slow)
queue.dispatch(Slow())
queue.start()
assert started.wait(10)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_interpreter_exits_with_a_database_queue_never_shut_down(
    backend: str, tmp_path: Any, database_urls: dict[str, str]
) -> None:
    url = database_urls["sqlite"] if backend == "sqlite" else _reachable(backend, SERVER_URLS[backend])
    table = f"life_{uuid.uuid4().hex[:10]}"
    try:
        began = time.monotonic()
        proc = _python("-c", textwrap.dedent(_NEVER_SHUT_DOWN), url, table)
        out, err = _communicate(proc, 30)
        assert proc.returncode == 0, err
        assert time.monotonic() - began < 20
        assert out == "exiting\n"
        warnings = [line for line in err.splitlines() if "never shut down" in line]
        assert len(warnings) == 1, err
        assert "1 running job(s) handed back" in warnings[0]
        # Handed back with its run spent, to run again elsewhere.
        assert execute(url, f"SELECT name, state, attempt FROM {table}") == [("slow", "queued", 1)]
    finally:
        drop_tables(url, table)


# -- item 22: shutdown reads what a worker may clear at any moment, once, under the lock ----


class _RacingSlot(worker._Slot):
    """A slot whose worker clears its abandoned run right after shutdown first reads it."""

    __slots__ = ("_run",)

    def __init__(self) -> None:
        self._run: worker._Run | None = None
        self.thread = None

    @property  # type: ignore[override]
    def run(self) -> worker._Run | None:
        value = self._run
        if value is not None and value.abandoned:
            self._run = None  # the worker's finally, between two reads
        return value

    @run.setter
    def run(self, value: worker._Run | None) -> None:
        self._run = value


def test_shutdown_hands_back_a_run_whose_worker_clears_its_slot_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "_Slot", _RacingSlot)
    queue = syncjobs.InMemoryJobQueue(workers=1)
    queue.register(ProbeJob)
    probe = Probe("cooperate", "ok")
    queue.start()
    try:
        queue.dispatch(ProbeJob(probe.id))
        probe.wait_runs(1)
        queue.shutdown(grace=0)  # no AttributeError, and the run handed back
        assert queue.pending_count() == 1
        queue.start()
        probe.wait_runs(2)
        assert queue.join(WAIT)
    finally:
        queue.shutdown(grace=0)


# -- item 1: a row never stays running while its worker lives ----------------------


def _refuse_deleting_first_runs(url: str, table: str) -> None:
    """A trigger that fails the DELETE of a row on its first run: an outcome write that keeps failing."""
    dialect = dialect_for(url)
    if dialect is SQLITE:
        execute(
            url,
            f"CREATE TRIGGER {table}_refuse BEFORE DELETE ON {table} WHEN OLD.attempt = 0 "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        )
    elif dialect is POSTGRES:
        execute(
            url,
            f"CREATE FUNCTION {table}_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF OLD.attempt = 0 THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN OLD; END $$",
        )
        execute(
            url,
            f"CREATE TRIGGER {table}_refuse BEFORE DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_refuse()",
        )
    else:
        execute(
            url,
            f"CREATE TRIGGER {table}_refuse BEFORE DELETE ON {table} FOR EACH ROW BEGIN "
            "IF OLD.attempt = 0 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF; END",
        )


def test_an_outcome_that_cannot_be_written_for_a_lease_is_given_up_and_the_job_runs_again(
    db_url: str, table: str, made: list[syncjobs.DatabaseJobQueue]
) -> None:
    # A lease long enough that a stall of a loaded machine does not expire the first claim before its run.
    queue = make(db_url, table, made, workers=2, lease=4.0)
    queue.install_schema()
    _refuse_deleting_first_runs(db_url, table)
    probe = Probe()
    queue.start()
    queue.dispatch(ProbeJob(probe.id))
    # The first run's DELETE fails until its lease is given up; the heartbeat
    # stops renewing it, the lease expires, and the second run's lands.
    assert queue.join(WAIT + 10), "the row stayed running"
    assert probe.attempts == [0, 1]
    if dialect_for(db_url) is POSTGRES:
        execute(db_url, f"DROP FUNCTION IF EXISTS {table}_refuse() CASCADE")


@pytest.fixture
def server_table(server_url: str) -> Iterator[str]:
    name = f"life_{uuid.uuid4().hex[:10]}"
    yield name
    drop_tables(server_url, name)


def test_rows_of_a_claim_whose_reply_was_lost_run_while_the_worker_lives(
    server_url: str, proxy: FaultProxy, server_table: str, made: list[syncjobs.DatabaseJobQueue]
) -> None:
    if dialect_for(server_url) is not POSTGRES:
        # MySQL claims in a transaction (SELECT … FOR UPDATE, UPDATE, COMMIT):
        # a lost reply before the COMMIT rolls the claim back.
        pytest.skip("a claim commits with its reply only where it is one statement (PostgreSQL)")
    producer = make(server_url, server_table, made, workers=0)
    probe = Probe()
    producer.dispatch_many([ProbeJob(probe.id, label) for label in range(20)])
    queue = make(proxy.url(server_url), server_table, made, workers=2, lease=2.0, prefetch=2)
    proxy.lose_reply(b"ELSE 'running' END, lease_owner")
    queue.start()
    wait_until(lambda: {run["label"] for run in probe.runs} == set(range(20)), timeout=WAIT + 10, what="all 20 jobs")
    assert proxy.replies_lost == 1
    assert queue.join(WAIT)


# -- item 10: shutdown bounded by its grace, one fetcher per open() ---------------


def _ready(queue: syncjobs.DatabaseJobQueue) -> None:
    """Started, and every loop connected: a job has run and its row is deleted.

    (A connection opened into a dead path waits for its connect timeout,
    which is the connection settings' business, not shutdown's.)
    """
    probe = Probe()
    queue.start()
    queue.dispatch(ProbeJob(probe.id))
    probe.wait_finished(1)
    assert queue.join(WAIT)


@pytest.mark.timeout(90)
def test_shutdown_during_a_black_hole_returns_within_the_grace_and_leaves_no_thread(
    server_url: str, proxy: FaultProxy, server_table: str
) -> None:
    before = syncjobs_threads()
    queue = syncjobs.DatabaseJobQueue(proxy.url(server_url), table=server_table, workers=2, poll_interval=0.2)
    queue.register(ProbeJob)
    _ready(queue)
    with proxy.blackholed():
        # The fetcher (polling every 0.2 s) is waiting on the dead path.
        wait_until(lambda: proxy.held() >= 1, what="a query held in the black hole")
        began = time.monotonic()
        queue.shutdown(grace=1)
        took = time.monotonic() - began
        left = {thread.name for thread in syncjobs_threads() - before if thread.is_alive()}
    assert took < 2.5, f"shutdown(grace=1) took {took:.1f}s"
    assert left == set()


@pytest.mark.timeout(30)
def test_a_write_that_fails_after_the_flush_deadline_is_left_to_its_lease_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pause longer than the test: the writer must not wait it out once close()'s deadline is past.
    monkeypatch.setattr(background, "RETRY_PAUSE", 600.0)
    stopping = threading.Event()
    calls: list[float] = []

    def complete(batch: list[Any], deadline: float) -> int:
        # The database fails the write as close() gives up on it (its deadline now past).
        calls.append(deadline)
        writer.flush_deadline = time.monotonic()
        stopping.set()
        raise OSError("the connections of this thread were closed")

    leases = background.Leases()
    settled: list[str] = []
    writer = background.OutcomeWriter(
        None,  # type: ignore[arg-type]  # completions only: no fenced UPDATE reaches the database
        leases,
        complete=complete,
        lease=30.0,
        settled=lambda envelopes: settled.extend(envelope.id for envelope in envelopes),
    )
    envelope = ClaimedEnvelope("job-1", "tests.probe", "{}", 3, lease="token")
    leases.hold([envelope.lease])
    writer.complete(envelope)
    thread = threading.Thread(target=writer.loop, args=(stopping,), name="test-writer")
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "the writer waited to try again past close()'s deadline"
    assert len(calls) == 1
    assert settled == ["job-1"]
    assert leases.tokens() == []


@pytest.mark.timeout(30)
def test_a_coalescing_writer_writes_the_first_outcome_at_once_and_the_stream_after_it_in_one_commit() -> None:
    stopping = threading.Event()
    batches: list[list[str]] = []

    def complete(batch: list[Any], deadline: float) -> int:
        batches.append([envelope.id for envelope in batch])
        return len(batch)

    leases = background.Leases()
    writer = background.OutcomeWriter(
        None,  # type: ignore[arg-type]  # completions only: no fenced UPDATE reaches the database
        leases,
        complete=complete,
        lease=30.0,
        coalesce=600.0,  # longer than the test: only the stop ends the wait
    )
    envelopes = [ClaimedEnvelope(f"job-{i}", "tests.probe", "{}", 3, lease=f"token-{i}") for i in range(4)]
    leases.hold([envelope.lease for envelope in envelopes])
    thread = threading.Thread(target=writer.loop, args=(stopping,), name="test-writer")
    thread.start()
    try:
        writer.complete(envelopes[0])
        wait_until(lambda: batches == [["job-0"]], what="the first outcome, written at once")
        writer.complete(envelopes[1])
        # Within the window nothing more is written (a writer that does not
        # coalesce writes it within microseconds).
        watched_until = time.monotonic() + 0.3
        while time.monotonic() < watched_until:
            assert batches == [["job-0"]]
            stopping.wait(0.01)
        for envelope in envelopes[2:]:
            writer.complete(envelope)
    finally:
        stopping.set()  # close(): what waits is written now, not at the window's end
        writer.wake()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert batches == [["job-0"], ["job-1", "job-2", "job-3"]]
    assert leases.tokens() == []


class _RecordingDatabase:
    """Runs the writer's fenced UPDATEs on a cursor that records them, each changing one row."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def run(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        database = self

        class Cursor:
            rowcount = 1
            description = None  # an UPDATE's: no rows to read

            def execute(self, sql: str, params: Any = ()) -> None:
                database.statements.append(sql)

        return operation(Cursor())

    def transaction(self, operation: Callable[[Any], T], *, deadline: float | None = None) -> T:
        return self.run(operation, deadline=deadline)


@pytest.mark.timeout(30)
def test_a_coalescing_writer_does_not_keep_a_worker_waiting_for_its_write() -> None:
    # A retry parked: its worker waits for the write; the window is not waited out.
    stopping = threading.Event()
    completed: list[str] = []
    database = _RecordingDatabase()
    writer = background.OutcomeWriter(
        database,
        background.Leases(),
        complete=lambda batch, deadline: completed.extend(envelope.id for envelope in batch) or len(batch),
        lease=30.0,
        coalesce=600.0,
    )
    thread = threading.Thread(target=writer.loop, args=(stopping,), name="test-writer")
    thread.start()
    try:
        writer.complete(ClaimedEnvelope("job-0", "tests.probe", "{}", 3, lease="token-0"))
        wait_until(lambda: completed == ["job-0"], what="the first outcome, written at once")
        parked = ClaimedEnvelope("job-1", "tests.probe", "{}", 3, lease="token-1")
        writer.write(parked, "UPDATE parked", (), wait=WAIT)
        assert database.statements == ["UPDATE parked"], "the worker's write waited for the window"
    finally:
        stopping.set()
        writer.wake()
        thread.join(WAIT)
    assert not thread.is_alive()


@pytest.mark.timeout(90)
def test_open_shutdown_open_leaves_exactly_one_fetcher(
    server_url: str, proxy: FaultProxy, server_table: str, made: list[syncjobs.DatabaseJobQueue]
) -> None:
    producer = make(server_url, server_table, made, workers=0)
    queue = make(proxy.url(server_url), server_table, made, workers=1)
    _ready(queue)
    proxy.refuse()
    probe = Probe()
    producer.dispatch(ProbeJob(probe.id))
    # The fetcher is trying to claim it, again and again, through the shutdown.
    tries = proxy.accepted
    wait_until(lambda: proxy.accepted >= tries + 3, timeout=WAIT, what="the fetcher retrying its claim")
    queue.shutdown(grace=0)
    proxy.resume()
    queue.start()
    probe.wait_finished(1)
    # The last open()'s fetcher only: the earlier one saw its own stop.
    wait_until(lambda: _fetchers() == 1, timeout=WAIT, what="one fetcher")
    # An earlier fetcher that came back to life would show within a second.
    watch_ends = time.monotonic() + 1.0
    while time.monotonic() < watch_ends:
        assert _fetchers() == 1
        threading.Event().wait(0.01)


def _fetcher_in_the_database() -> bool:
    """Whether a fetcher thread is inside a database call now (its current frames, read from outside)."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1) if thread.name == "syncjobs-fetcher" else None
        while frame is not None:
            # _attempt_past_locks: between its tries at a locked database it sleeps outside _attempt.
            name = frame.f_code.co_name
            if name in {"_attempt", "_attempt_past_locks"} and frame.f_code.co_filename.endswith("connections.py"):
                return True
            frame = frame.f_back
    return False


def _fetchers() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "syncjobs-fetcher" and thread.is_alive())


@pytest.mark.timeout(90)
def test_sqlite_shutdown_while_another_connection_holds_the_write_lock_is_bounded(
    tmp_path: Any, made: list[syncjobs.DatabaseJobQueue]
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    queue = make(url, "jobs", made, workers=2)
    _ready(queue)
    holder = sqlite3.connect(str(tmp_path / "jobs.db"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        # The fetcher (polling every 0.2 s) is waiting on the lock in the database.
        wait_until(_fetcher_in_the_database, what="the fetcher to wait on the lock")
        began = time.monotonic()
        queue.shutdown(grace=1)
        took = time.monotonic() - began
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert took < 2.5, f"shutdown(grace=1) took {took:.1f}s"


# -- item 9 (the listener's part): a silently dead notification connection is noticed ------


@pytest.mark.timeout(90)
def test_the_listener_notices_a_dead_connection_and_listens_again(  # noqa: PLR0917 - fixtures
    server_url: str,
    proxy: FaultProxy,
    server_table: str,
    made: list[syncjobs.DatabaseJobQueue],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if dialect_for(server_url) is not POSTGRES:
        pytest.skip("only PostgreSQL has a listener")
    monkeypatch.setattr(background, "LISTENER_CHECK_EVERY", 0.5)
    monkeypatch.setattr(background, "LISTENER_CHECK_WITHIN", 1.0)
    producer = make(server_url, server_table, made, workers=0)
    # A poll interval longer than the test: only a NOTIFY can wake the fetcher.
    queue = make(proxy.url(server_url), server_table, made, workers=1, poll_interval=60)
    _ready(queue)

    def dropped() -> bool:
        return any("notification connection dropped" in record.getMessage() for record in caplog.records)

    with proxy.blackholed():
        wait_until(dropped, timeout=WAIT, what="the listener to notice its dead connection")
    probe = Probe()
    began = time.monotonic()
    producer.dispatch(ProbeJob(probe.id))
    probe.wait_finished(1, timeout=WAIT)
    assert time.monotonic() - began < WAIT
