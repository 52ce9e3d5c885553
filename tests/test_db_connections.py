"""The database backend's connections: per process, bounded in number and in time, one error for an outage."""

from __future__ import annotations

import calendar
import concurrent.futures
import contextlib
import gc
import importlib
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import tracemalloc
import types
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import syncjobs
from syncjobs.database.connections import DEFAULT_POOL_SIZE, Connections, _Connection, _Watchdog
from syncjobs.database.dialects import MYSQL, POSTGRES, Connector
from syncjobs.database.schema import COMPANIONS
from tests.conftest import TEST_TABLE
from tests.faultproxy import FaultProxy
from tests.helpers import WAIT, Probe, ProbeJob, wait_until


def make(url: str, made: list[syncjobs.DatabaseJobQueue], **options: Any) -> syncjobs.DatabaseJobQueue:
    options.setdefault("queue", f"q-{uuid.uuid4().hex[:12]}")
    options.setdefault("poll_interval", 0.2)
    options.setdefault("table", TEST_TABLE)
    options.setdefault("workers", 0)
    queue = syncjobs.DatabaseJobQueue(url, **options)
    queue.register(ProbeJob)
    made.append(queue)
    return queue


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """On a connection of the test's own, outside syncjobs."""
    conn = Connector(url).connect()
    try:
        cursor = conn.cursor()
        cursor.execute(sql, params)
        rows = list(cursor.fetchall()) if cursor.description else []
        cursor.close()
        return rows
    finally:
        conn.close()


def in_thread(call: Callable[[], object], timeout: float) -> tuple[bool, object]:
    """Run ``call`` in a daemon thread: (finished within ``timeout``, its result or exception)."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    return (not thread.is_alive(), outcome[0] if outcome else None)


# -- item 9 and 12: a dead or refused network path ------------------------------


@pytest.mark.timeout(90)
def test_dispatch_during_a_black_hole_raises_within_its_timeout(
    server_url: str, proxy: FaultProxy, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    queue = make(proxy.url(server_url), queues, dispatch_timeout=2.0)
    probe = Probe()
    queue.dispatch(ProbeJob(probe.id))  # the tables, and a connection that will go silent
    proxy.blackhole()
    try:
        began = time.monotonic()
        tries = 0
        # Dispatch again and again for 10 s of black hole: each one gives up in time.
        while time.monotonic() - began < 10.0:
            started = time.monotonic()
            finished, outcome = in_thread(lambda: queue.dispatch(ProbeJob(probe.id)), timeout=30.0)
            took = time.monotonic() - started
            assert finished, "dispatch still blocked 30 s into a black hole"
            assert isinstance(outcome, syncjobs.DatabaseUnavailable), outcome
            assert took <= 2.0 + 1.0, f"dispatch took {took:.1f}s with dispatch_timeout=2"
            assert "'tests.probe'" in str(outcome)
            tries += 1
        assert tries >= 3
    finally:
        proxy.resume()
    # The path is back: the next dispatch lands, on a new connection.
    job_id = queue.dispatch(ProbeJob(probe.id))
    assert query(server_url, f"SELECT COUNT(*) FROM {TEST_TABLE} WHERE id = %s", (job_id,)) == [(1,)]


@pytest.mark.timeout(60)
def test_first_dispatch_with_auto_schema_during_an_outage_is_database_unavailable(
    server_url: str, proxy: FaultProxy, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    proxy.refuse()
    queue = make(proxy.url(server_url), queues, dispatch_timeout=1.0, auto_schema=True)
    began = time.monotonic()
    with pytest.raises(syncjobs.DatabaseUnavailable, match="database is unavailable"):
        queue.dispatch(ProbeJob(Probe().id))
    assert time.monotonic() - began <= 1.0 + 1.0
    with pytest.raises(syncjobs.DatabaseUnavailable):
        queue.pending_count()
    proxy.resume()
    queue.dispatch(ProbeJob(Probe().id))  # the migration runs now, and the insert
    assert queue.pending_count() == 1


def fetch_one(sql: str) -> Callable[[Any], tuple[Any, ...]]:
    def operation(cursor: Any) -> tuple[Any, ...]:
        cursor.execute(sql)
        return tuple(cursor.fetchone())

    return operation


def test_every_session_has_network_and_server_timeouts(server_url: str) -> None:
    connections = Connections(Connector(server_url))
    try:
        if Connector(server_url).dialect is POSTGRES:
            conn = Connector(server_url).connect()
            try:
                params = conn.info.get_parameters()
            finally:
                conn.close()
            assert params.get("keepalives") == "1"
            assert int(params["tcp_user_timeout"]) > 0
            assert int(params["connect_timeout"]) > 0
            timeouts = connections.run(
                fetch_one("SELECT current_setting('statement_timeout'), current_setting('lock_timeout')")
            )
            assert "0" not in timeouts
        else:
            zone, lock_wait = connections.run(
                fetch_one("SELECT @@session.time_zone, @@session.innodb_lock_wait_timeout")
            )
            assert zone == "+00:00"
            assert int(lock_wait) < 50  # the server's default
    finally:
        connections.close()


@pytest.mark.timeout(60)
def test_the_watchdog_keeps_nothing_of_operations_that_ended() -> None:
    # A busy worker runs thousands of operations a second, each armed for
    # ATTEMPT_TIMEOUT: what ended must not stay until its end time comes.
    watchdog = _Watchdog()
    conn = _Connection(None, abort=lambda: None, close=lambda: None)
    try:
        watchdog.disarm(watchdog.arm(conn, time.monotonic() + 60))  # the thread, started once
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(20_000):
                watchdog.disarm(watchdog.arm(conn, time.monotonic() + 60))
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    finally:
        watchdog.stop()
    assert kept < 20_000, f"{kept} bytes kept for 20,000 operations that ended"


@pytest.mark.timeout(120)
def test_an_operation_armed_while_the_watchdog_stops_does_not_hold_up_the_stop() -> None:
    # A loop's last try arms (its end time already past) just as close() stops
    # the watchdog: the thread started for it must not keep the stopped one alive.
    others = set(threading.enumerate())  # another test's queue may still have its own
    slow: list[float] = []
    for _ in range(100):
        watchdog = _Watchdog()
        watchdog.arm(_Connection(None, abort=lambda: None, close=lambda: None), time.monotonic() + 60)
        go = threading.Event()

        def last_try(watchdog: _Watchdog = watchdog, go: threading.Event = go) -> None:
            go.wait()
            watchdog.disarm(watchdog.arm(_Connection(None, abort=lambda: None, close=lambda: None), 0.0))

        thread = threading.Thread(target=last_try)
        thread.start()
        began = time.monotonic()
        go.set()
        watchdog.stop()
        took = time.monotonic() - began
        thread.join(10)
        watchdog.stop()  # the final close(): stops a thread started for the last try
        if took > 0.5:
            slow.append(took)
    assert not slow, f"{len(slow)} of 100 stops waited for a watchdog thread: {slow[:5]}"
    wait_until(
        lambda: not [t for t in set(threading.enumerate()) - others if t.name == "syncjobs-watchdog"],
        what="no watchdog of this test's",
    )


@pytest.mark.timeout(60)
def test_close_does_not_wait_for_a_reader_blocked_on_a_dead_path(server_url: str, proxy: FaultProxy) -> None:
    connections = Connections(Connector(proxy.url(server_url)))
    connected, go, reading = threading.Event(), threading.Event(), threading.Event()

    def select_2(cursor: Any) -> object:
        reading.set()  # the connection is this thread's now, and it is about to read
        cursor.execute("SELECT 2")
        return cursor.fetchone()

    def reader() -> object:
        connections.run(fetch_one("SELECT 1"))  # a connection that works, then goes silent
        connected.set()
        go.wait(WAIT)
        return connections.run(select_2, timeout=8.0)

    outcomes: list[tuple[bool, object]] = []
    thread = threading.Thread(target=lambda: outcomes.append(in_thread(reader, timeout=20.0)), daemon=True)
    thread.start()
    try:
        assert connected.wait(WAIT)
        proxy.blackhole()
        go.set()
        assert reading.wait(WAIT)
        finished, outcome = in_thread(connections.close, timeout=3.0)
        assert finished, "close() waited on the blocked reader"
        assert outcome is None
        thread.join(30.0)
        assert outcomes, "the reader never returned"
        finished, outcome = outcomes[0]
        assert finished, "the reader stayed blocked past its timeout"
        assert isinstance(outcome, syncjobs.DatabaseUnavailable), outcome
    finally:
        proxy.resume()
        connections.close()


# -- item 7: forked children ------------------------------------------------------


def _fork_child(work: Callable[[], None], errors: Path) -> int:
    with warnings.catch_warnings():
        # A test process has threads (the proxy's, pytest's); the child only dispatches and exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        work()
    except BaseException:  # noqa: BLE001 - reported to the parent through the file
        errors.write_text(traceback.format_exc())
        code = 1
    finally:
        os._exit(code)


def _wait_children(pids: list[int], timeout: float) -> dict[int, int]:
    codes: dict[int, int] = {}

    def reaped() -> bool:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        return len(codes) == len(pids)

    with contextlib.suppress(AssertionError):  # those still running are killed below
        wait_until(reaped, timeout=timeout, what="the children's exit")
    for pid in pids:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            codes[pid] = -signal.SIGKILL
    return codes


@pytest.mark.timeout(120)
def test_forked_children_open_their_own_connections(
    server_url: str, queues: list[syncjobs.DatabaseJobQueue], tmp_path: Path
) -> None:
    queue = make(server_url, queues)
    probe = Probe()
    queue.dispatch(ProbeJob(probe.id))  # the parent holds a connection when it forks
    children, per_child = 4, 300
    go_read, go_write = os.pipe()

    def dispatch_many() -> None:
        os.read(go_read, 1)  # all children at once, as a pre-forking server's workers under load
        for label in range(per_child):
            queue.dispatch(ProbeJob(probe.id, label))
            if label % 10 == 0:  # a web worker reads as well as writes
                assert queue.pending_count() >= 1

    try:
        pids = [_fork_child(dispatch_many, tmp_path / f"child-{n}.err") for n in range(children)]
        os.write(go_write, b"g" * children)
        codes = _wait_children(pids, timeout=90.0)
    finally:
        os.close(go_read)
        os.close(go_write)
    errors = [path.read_text() for path in sorted(tmp_path.glob("child-*.err"))]
    assert codes == dict.fromkeys(pids, 0), errors
    # The parent's connection was neither used nor closed by a child.
    queue.dispatch(ProbeJob(probe.id))
    assert queue.pending_count() == 1 + children * per_child + 1


# -- item 8: many short-lived threads -----------------------------------------------


def _session_counter(server_url: str) -> tuple[str, Callable[[], int], Callable[[], None]]:
    """A URL whose sessions can be told apart on the server, a count of them, and a cleanup."""
    tag = f"syncjobs_sessions_{uuid.uuid4().hex[:12]}"
    if Connector(server_url).dialect is POSTGRES:
        url = f"{server_url}{'&' if '?' in server_url else '?'}application_name={tag}"
        count_sql = "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = %s"
        return url, lambda: int(query(server_url, count_sql, (tag,))[0][0]), lambda: None
    query(server_url, f"CREATE DATABASE {tag}")
    url = server_url.rsplit("/", 1)[0] + f"/{tag}"
    count_sql = "SELECT COUNT(*) FROM information_schema.processlist WHERE db = %s"
    return (
        url,
        lambda: int(query(server_url, count_sql, (tag,))[0][0]),
        lambda: query(server_url, f"DROP DATABASE {tag}"),
    )


@pytest.mark.timeout(120)
def test_short_lived_dispatching_threads_share_a_bounded_pool(
    server_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    url, sessions, cleanup = _session_counter(server_url)
    try:
        queue = make(url, queues)
        queue.install_schema()
        probe = Probe()
        failures: list[BaseException] = []

        def request() -> None:
            try:
                queue.dispatch(ProbeJob(probe.id))
            except BaseException as exc:  # noqa: BLE001 - the test asserts there were none
                failures.append(exc)

        peak = 0
        for _ in range(6):  # 60 request threads, 10 at a time, each gone when it is done
            threads = [threading.Thread(target=request) for _ in range(10)]
            for thread in threads:
                thread.start()
            peak = max(peak, sessions())
            for thread in threads:
                thread.join(WAIT)
        assert not failures, failures
        assert queue.pending_count() == 60
        assert peak <= DEFAULT_POOL_SIZE
        assert sessions() <= DEFAULT_POOL_SIZE, "a session per thread that ever dispatched"
        queue.shutdown(grace=0)
        wait_until(lambda: sessions() == 0, what="every session closed at shutdown")
    finally:
        for queue in queues:
            queue.shutdown(grace=0)
        cleanup()


# -- item 11: SQLite's lock ------------------------------------------------------------


@pytest.mark.timeout(60)
def test_sqlite_dispatch_gives_up_on_a_held_write_lock_within_its_timeout(
    tmp_path: Path, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    path = tmp_path / "jobs.db"
    queue = make(f"sqlite:///{path}", queues, dispatch_timeout=1.0)
    queue.install_schema()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's writer, holding the write lock
        began = time.monotonic()
        with pytest.raises(syncjobs.DatabaseUnavailable, match="sqlite database is unavailable"):
            queue.dispatch(ProbeJob(Probe().id))
        took = time.monotonic() - began
        assert 0.9 <= took <= 2.0, f"gave up after {took:.1f}s with dispatch_timeout=1"
        other.execute("ROLLBACK")
    finally:
        other.close()
    queue.dispatch(ProbeJob(Probe().id))
    assert queue.pending_count() == 1


@pytest.mark.timeout(60)
def test_sqlite_dispatch_takes_the_write_lock_within_milliseconds_of_its_release(
    tmp_path: Path, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    """SQLite's busy handler sleeps longer as it waits (100 ms after 0.3 s); syncjobs tries every 10 ms at most."""
    path = tmp_path / "jobs.db"
    queue = make(f"sqlite:///{path}", queues)
    queue.install_schema()
    other = sqlite3.connect(path, isolation_level=None)
    done = threading.Event()
    finished_at: list[float] = []

    def dispatch() -> None:
        queue.dispatch(ProbeJob(Probe().id))
        finished_at.append(time.monotonic())
        done.set()

    # How late a thread of this process wakes for the release on this machine, as busy as it is then:
    # a loaded machine delays the dispatcher's wake-up as much, and that is not the lock's doing.
    released_event = threading.Event()
    witnessed_at: list[float] = []

    def witness() -> None:
        released_event.wait(WAIT)
        witnessed_at.append(time.monotonic())

    try:
        other.execute("BEGIN IMMEDIATE")  # another process's writer, holding the write lock
        dispatcher = threading.Thread(target=dispatch)
        witnessing = threading.Thread(target=witness)
        witnessing.start()
        began = time.monotonic()
        dispatcher.start()
        # The writer's transaction lasts 0.45 s: the fault, not a synchronisation.
        assert not done.wait(0.45), "the dispatch went in under a held write lock"
        other.execute("ROLLBACK")
        released = time.monotonic()
        released_event.set()
        dispatcher.join(WAIT)
        witnessing.join(WAIT)
    finally:
        released_event.set()
        other.close()
    assert finished_at, "the dispatch never went in"
    late = witnessed_at[0] - released
    assert finished_at[0] - released < 0.04 + late, (
        f"the dispatch went in {1000 * (finished_at[0] - released):.0f} ms after the lock was released "
        f"({1000 * (released - began):.0f} ms after it began; a thread woke {1000 * late:.0f} ms after it)"
    )
    assert queue.pending_count() == 1


# -- item 13: MySQL/MariaDB's clock in a zone with daylight saving ------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def berlin_mariadb(tmp_path: Path) -> Iterator[str]:
    """A throwaway MariaDB whose system time zone is Europe/Berlin (not the machine's server)."""
    install, server = shutil.which("mariadb-install-db"), shutil.which("mariadbd") or "/usr/sbin/mariadbd"
    if install is None or not os.path.exists(server) or not os.path.exists("/usr/share/zoneinfo/Europe/Berlin"):
        pytest.skip("needs mariadb-install-db, mariadbd and the Europe/Berlin zone file")
    data = tmp_path / "data"
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    subprocess.run(
        [
            install,
            "--no-defaults",
            f"--datadir={data}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *as_root,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [
            server,
            "--no-defaults",
            f"--datadir={data}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            f"--socket={tmp_path / 'mysqld.sock'}",
            f"--pid-file={tmp_path / 'mysqld.pid'}",
            "--skip-grant-tables",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=16M",
            *as_root,
        ],
        env={**os.environ, "TZ": "Europe/Berlin"},
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    log.close()  # the server has its own copy
    url = f"mysql://root@127.0.0.1:{port}/mysql"

    def answers() -> bool:
        with contextlib.suppress(Exception):
            Connector(url).connect().close()
            return True
        return process.poll() is not None

    try:
        wait_until(answers, timeout=30, what="the throwaway MariaDB to answer")
        if process.poll() is not None:
            pytest.skip(f"the throwaway MariaDB did not start: {(tmp_path / 'server.log').read_text()[-500:]}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_mysql_clock_is_utc_epoch_through_a_daylight_saving_change(berlin_mariadb: str) -> None:
    assert query(berlin_mariadb, "SELECT @@system_time_zone")[0][0] in ("CET", "CEST")
    connections = Connections(Connector(berlin_mariadb))
    try:
        # 02:30 on 2025-10-26 happens twice in Berlin: at 00:30 UTC (CEST) and at 01:30 UTC (CET).
        for instant in (calendar.timegm((2025, 10, 26, 0, 30, 0)), calendar.timegm((2025, 10, 26, 1, 30, 0))):

            def clock(cursor: Any, instant: int = instant) -> float:
                cursor.execute("SET timestamp = %s", (instant,))  # the server's clock at that instant
                try:
                    cursor.execute(f"SELECT {MYSQL.now}")
                    return float(cursor.fetchone()[0])
                finally:
                    cursor.execute("SET timestamp = DEFAULT")

            assert connections.run(clock) == instant
    finally:
        connections.close()


# -- contention is not an outage ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("server_url", ["postgresql"], indirect=True)
def test_a_deadlock_is_tried_again_on_the_same_connection_and_not_taken_for_an_outage(
    server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    table = f"deadlock_{uuid.uuid4().hex[:10]}"
    query(server_url, f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
    other = Connector(server_url).connect()
    connections = Connections(Connector(server_url))
    backends: list[int] = []
    holding_row_1 = threading.Event()
    other_is_waiting = threading.Event()
    executor = concurrent.futures.ThreadPoolExecutor(2)

    def operation(cursor: Any) -> int:
        cursor.execute("SELECT pg_backend_pid()")
        backends.append(int(cursor.fetchone()[0]))
        cursor.execute(f"UPDATE {table} SET n = n + 1 WHERE id = 1")
        holding_row_1.set()
        assert other_is_waiting.wait(WAIT)
        # This closes the cycle: the other transaction already waits, and for
        # longer than its own deadlock_timeout, so only this wait's check can
        # find the cycle and this transaction is the one rolled back.
        cursor.execute(f"UPDATE {table} SET n = n + 1 WHERE id = 2")
        return len(backends)

    def other_waiting_for_a_lock() -> bool:
        found = query(server_url, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (other_pid,))
        return bool(found) and found[0][0] == "Lock"

    try:
        if query(server_url, "SELECT current_setting('is_superuser')") != [("on",)]:
            pytest.skip("setting deadlock_timeout, which decides which side is rolled back, takes a superuser")
        query(server_url, f"INSERT INTO {table} VALUES (1, 0), (2, 0)")
        cursor = other.cursor()
        cursor.execute("SELECT pg_backend_pid()")
        other_pid = int(cursor.fetchone()[0])
        cursor.execute("BEGIN")
        # A deadlock check runs once per wait, deadlock_timeout after it begins:
        # the other side's check is put beyond the test, so the outcome does not
        # depend on how fast this machine runs the steps between the two waits.
        cursor.execute("SET LOCAL deadlock_timeout = '1h'")
        cursor.execute(f"UPDATE {table} SET n = n + 10 WHERE id = 2")
        with caplog.at_level(logging.DEBUG, logger="syncjobs"):
            future = executor.submit(connections.transaction, operation, timeout=30)
            assert holding_row_1.wait(WAIT)
            waiting = executor.submit(cursor.execute, f"UPDATE {table} SET n = n + 10 WHERE id = 1")
            wait_until(other_waiting_for_a_lock, what="the other transaction waiting for the operation's row")
            other_is_waiting.set()
            waiting.result(WAIT)  # the operation rolled back, which released row 1
            cursor.execute("COMMIT")
            result = future.result(WAIT)
        assert result == 2
        assert backends[0] == backends[1], "the deadlock closed the connection"
        assert sorted(query(server_url, f"SELECT id, n FROM {table}")) == [(1, 11), (2, 11)]
        complaints = [
            r.getMessage() for r in caplog.records if r.name.startswith("syncjobs") and r.levelno >= logging.WARNING
        ]
        assert complaints == []
        # Tried again at once, in the short steps of contention: not after the
        # backoff an unreachable server gets (which logs "was busy" before it waits).
        assert not any("was busy" in r.getMessage() for r in caplog.records)
    finally:
        other_is_waiting.set()
        other.close()
        executor.shutdown()
        connections.close()
        query(server_url, f"DROP TABLE IF EXISTS {table}")


# -- item 14: PostgreSQL's identifier limit and the NOTIFY channel ---------------------------


@pytest.mark.parametrize("server_url", ["postgresql"], indirect=True)
def test_a_54_character_table_name_dispatches_and_is_picked_up(
    server_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    table = "syncjobs_long_" + "x" * 40
    assert len(table) == 54
    try:
        queue = make(server_url, queues, table=table, workers=1, poll_interval=30.0)
        probe = Probe()
        with queue:
            idle = make(server_url, queues, table=table, workers=0, queue=queue.queue_name)
            # Dispatched by another queue object: only the NOTIFY wakes the worker before its 30 s poll.
            idle.dispatch(ProbeJob(probe.id))
            probe.wait_finished(1)
    finally:
        for queue in queues:
            queue.shutdown(grace=0)
        for suffix in ("", *COMPANIONS):
            query(server_url, f"DROP TABLE IF EXISTS {table}{suffix}")


def test_mysql_errors_are_told_apart_where_pymysql_stands_in_for_mysqldb(monkeypatch: pytest.MonkeyPatch) -> None:
    """Django projects run ``pymysql.install_as_MySQLdb()``; Django's MySQL backend then imports
    ``MySQLdb.converters``, which loads a second copy of ``pymysql/err.py`` and rebinds
    ``pymysql.err`` to it, while PyMySQL's connections still raise the first copy's classes."""
    pymysql = pytest.importorskip("pymysql")
    from syncjobs.database.mysql import MYSQL

    raised = sys.modules["pymysql.err"]  # what pymysql.connections raises from
    for name in [name for name in sys.modules if name == "MySQLdb" or name.startswith("MySQLdb.")]:
        monkeypatch.delitem(sys.modules, name)
    for name, value in list(vars(pymysql).items()):  # its submodules, rebound below: put back after the test
        if isinstance(value, types.ModuleType):
            monkeypatch.setattr(pymysql, name, value)
    monkeypatch.setitem(sys.modules, "MySQLdb", pymysql)  # what install_as_MySQLdb() does
    try:
        importlib.import_module("MySQLdb.converters")
    finally:
        for name in [name for name in sys.modules if name.startswith("MySQLdb.")]:
            del sys.modules[name]  # the copies this loaded leave with the test (the monkeypatch puts back any earlier)
    assert pymysql.err is not raised  # the second copy, as in a Django worker

    lost = raised.OperationalError(2013, "Lost connection to MySQL server during query")
    deadlock = raised.OperationalError(1213, "Deadlock found when trying to get lock")
    assert MYSQL.is_connection_error(pymysql, lost)
    assert not MYSQL.is_contention(pymysql, lost)
    assert MYSQL.is_contention(pymysql, deadlock)
    assert not MYSQL.is_connection_error(pymysql, deadlock)
