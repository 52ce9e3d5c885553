"""A worker process for the multi-process tests: ``python -m tests.dbworker URL QUEUE [options]``.

Its jobs write a ledger row per run (job number, attempt, pid, when the run
started and ended), so that a test can tell exactly which process ran what,
and when. The ledger has its own connections, to ``--ledger-url`` if given
(the server itself, when the queue's URL goes through a fault proxy), and
rides out a dropped connection on its own: a fault in the test's bookkeeping
is not a fault of the library. The process prints ``ready`` once it takes
work, and stops gracefully on SIGTERM.

:class:`Workers` spawns and stops such processes from a test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import IO, Any, NamedTuple

import tenacity

import syncjobs
from syncjobs.database.dialects import Connector

#: The ledger's table (version 2: one row per run, keyed by a run token, with its start and end).
LEDGER_TABLE = "syncjobs_test_runs"
#: How long the ledger keeps trying through a dropped connection before it gives up.
LEDGER_PATIENCE = 60.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Run(NamedTuple):
    n: int
    attempt: int
    pid: int
    started: float  # time.time() of the worker's host, the same clock as the test's
    ended: float | None  # None: the run never finished (its process died, or it still runs)


class Ledger:
    """Which process ran which job, when: rows in ``LEDGER_TABLE``, one per run."""

    def __init__(self, url: str) -> None:
        self.connector = Connector(url)
        self.driver = self.connector.driver
        self.local = threading.local()
        self.lock = threading.Lock()
        self.connections: list[Any] = []  # every thread's, for close()
        mark = self.connector.dialect.placeholder
        self.mark = mark
        self.insert = (
            f"INSERT INTO {LEDGER_TABLE} (queue, run, n, attempt, pid, started) "
            f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark})"
        )
        self.finish_sql = f"UPDATE {LEDGER_TABLE} SET ended = {mark} WHERE queue = {mark} AND run = {mark}"

    # -- connections that ride out a drop ---------------------------------------

    def _connection(self) -> Any:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.connector.connect()
            if self.connector.dialect.name == "postgresql":
                # Bookkeeping, not the queue: no need to wait for fsync (the tests never crash the server).
                cursor = conn.cursor()
                cursor.execute("SET synchronous_commit TO off")
                cursor.close()
            self.local.conn = conn
            with self.lock:
                self.connections.append(conn)
        return conn

    def _drop(self) -> None:
        conn, self.local.conn = getattr(self.local, "conn", None), None
        if conn is not None:
            self._close(conn)

    def _close(self, conn: Any) -> None:
        with self.lock:
            if conn in self.connections:
                self.connections.remove(conn)
        with contextlib.suppress(Exception):  # it may be broken already
            conn.close()

    def _execute(self, sql: str, params: tuple[Any, ...], *, fetch: bool = False) -> list[tuple[Any, ...]]:
        """``sql`` on this thread's connection; on a dropped connection (or a busy SQLite), reconnect and retry."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((self.driver.OperationalError, self.driver.InterfaceError)),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
            stop=tenacity.stop_after_delay(LEDGER_PATIENCE),
            before_sleep=lambda state: self._drop(),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                try:
                    cursor = self._connection().cursor()
                    try:
                        cursor.execute(sql, params)
                        return list(cursor.fetchall()) if fetch else []
                    finally:
                        cursor.close()
                except self.driver.IntegrityError:
                    # A retried insert whose first try landed before its reply was lost.
                    if attempt.retry_state.attempt_number > 1 and sql == self.insert:
                        return []
                    raise
        raise AssertionError("unreachable: tenacity re-raises")  # pragma: no cover

    def close(self) -> None:
        """Close every connection of this ledger (its users are done)."""
        with self.lock:
            connections = list(self.connections)
        for conn in connections:
            self._close(conn)
        self.local = threading.local()

    # -- the table ------------------------------------------------------------

    def create(self) -> None:
        self._execute(
            f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (queue VARCHAR(100) NOT NULL, run VARCHAR(32) NOT NULL, "
            "n INTEGER NOT NULL, attempt INTEGER NOT NULL, pid INTEGER NOT NULL, "
            "started DOUBLE PRECISION NOT NULL, ended DOUBLE PRECISION, PRIMARY KEY (queue, run))",
            (),
        )

    def start(self, queue: str, n: int, attempt: int) -> str:
        """Record that a run began in this process; returns its token for :meth:`finish`."""
        run = uuid.uuid4().hex
        self._execute(self.insert, (queue, run, n, attempt, os.getpid(), time.time()))
        return run

    def finish(self, queue: str, run: str) -> None:
        self._execute(self.finish_sql, (time.time(), queue, run))

    def record(self, queue: str, n: int, attempt: int) -> None:
        """A run that began and ended at once."""
        self.finish(queue, self.start(queue, n, attempt))

    # -- reading --------------------------------------------------------------

    def runs(self, queue: str) -> list[tuple[int, int, int]]:
        """``(n, attempt, pid)`` of every run, by job and attempt."""
        return [(run.n, run.attempt, run.pid) for run in self.details(queue)]

    def details(self, queue: str) -> list[Run]:
        """Every run of ``queue``'s jobs, by job, attempt and start."""
        rows = self._execute(
            f"SELECT n, attempt, pid, started, ended FROM {LEDGER_TABLE} WHERE queue = {self.mark} "
            "ORDER BY n, attempt, started",
            (queue,),
            fetch=True,
        )
        return [Run(int(n), int(a), int(p), float(s), None if e is None else float(e)) for n, a, p, s, e in rows]

    def started_since(self, queue: str, since: float) -> dict[int, int]:
        """How many runs each pid started at or after ``since`` (a ``time.time()``)."""
        rows = self._execute(
            f"SELECT pid, COUNT(*) FROM {LEDGER_TABLE} WHERE queue = {self.mark} AND started >= {self.mark} "
            "GROUP BY pid",
            (queue, since),
            fetch=True,
        )
        return {int(pid): int(count) for pid, count in rows}


class _Process:
    """This process's ledger: set by main() in a worker process, by :func:`use_ledger` in a test."""

    ledger: Ledger | None = None


def use_ledger(ledger: Ledger | None) -> None:
    """Let LedgerJobs run in this process (a test's own queue), recording in ``ledger``."""
    _Process.ledger = ledger


@dataclasses.dataclass
class LedgerJob(syncjobs.Job):
    """Records its run, then works for ``seconds`` (attempt 0) and fails as told."""

    NAME = "tests.ledger"
    queue: str
    n: int
    seconds: float = 0.0
    fatal_on_retry: bool = False
    #: If given, only a run in that process works for ``seconds``.
    slow_pid: int = 0

    def run(self) -> None:
        info = syncjobs.current_job()
        ledger = _Process.ledger
        assert info is not None
        assert ledger is not None
        run = ledger.start(self.queue, self.n, info.attempt)
        try:
            if info.attempt > 0 and self.fatal_on_retry:
                raise syncjobs.Fatal("second run")
            if self.seconds and info.attempt == 0 and self.slow_pid in (0, os.getpid()):
                # Plain blocking work that does not look at the cancel token, as a
                # slow API call would; only a killed or stopped process interrupts it.
                threading.Event().wait(self.seconds)
        finally:
            ledger.finish(self.queue, run)


class LimitedLedgerJob(LedgerJob):
    """A ledger job of which at most two run at once, across every process."""

    NAME = "tests.ledger_limited"
    LIMIT = syncjobs.Limit(running=2)


class RatedLedgerJob(LedgerJob):
    """A ledger job of which at most 60 begin a minute (one a second), across every process."""

    NAME = "tests.ledger_rated"
    LIMIT = syncjobs.Limit(rate="60/m")


class OnceLedgerJob(LedgerJob):
    """A ledger job with one run in all."""

    NAME = "tests.ledger_once"
    MAX_ATTEMPTS = 1


@dataclasses.dataclass
class KillerJob(syncjobs.Job):
    """Records its run, then kills its own worker process at once (a poison job)."""

    NAME = "tests.killer"
    MAX_ATTEMPTS = 2
    queue: str
    n: int

    def run(self) -> None:
        info = syncjobs.current_job()
        assert info is not None
        assert _Process.ledger is not None
        _Process.ledger.record(self.queue, self.n, info.attempt)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclasses.dataclass
class SumJob(syncjobs.Job):
    """Returns the sum of ``numbers`` (its result); a negative one makes it a dead letter at once."""

    NAME = "tests.sum"
    numbers: list[int]

    def run(self) -> dict[str, int]:
        if any(n < 0 for n in self.numbers):
            raise syncjobs.Fatal(f"negative: {min(self.numbers)}")
        return {"sum": sum(self.numbers)}


@dataclasses.dataclass
class WaitJob(syncjobs.Job):
    """Waits up to ``seconds`` for its cancel token, reporting progress; stops early (Cancelled) once it is set."""

    NAME = "tests.wait"
    seconds: float = 60.0

    def run(self) -> None:
        info = syncjobs.current_job()
        assert info is not None
        info.progress(1, 2, "waiting")
        if info.cancelled.wait(self.seconds):
            raise syncjobs.Cancelled()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("--table", default="syncjobs_test_jobs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--ledger-url", help="where the ledger writes (default: URL)")
    parser.add_argument("--poll-interval", type=float, default=0.2)
    parser.add_argument("--log-level", help="the library's logs from this level on, on stderr, with their levels")
    parser.add_argument(
        "--schedule-every",
        type=float,
        help="a schedule 'tests.tick': a LedgerJob numbered by its slot, every N seconds",
    )
    args = parser.parse_args(argv)
    if args.log_level:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
        logging.getLogger("syncjobs").setLevel(args.log_level)
    _Process.ledger = Ledger(args.ledger_url or args.url)
    queue = syncjobs.DatabaseJobQueue(
        args.url,
        workers=args.workers,
        queue=args.queue,
        table=args.table,
        lease=args.lease,
        shutdown_grace=args.grace,
        poll_interval=args.poll_interval,
    )
    queue.register(LedgerJob)
    queue.register(OnceLedgerJob)
    queue.register(LimitedLedgerJob)
    queue.register(RatedLedgerJob)
    queue.register(KillerJob)
    queue.register(SumJob)
    queue.register(WaitJob)
    if args.schedule_every:
        queue.schedule(
            "tests.tick", lambda slot: LedgerJob(args.queue, int(slot.timestamp())), every=args.schedule_every
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    queue.start()
    print("ready", flush=True)  # noqa: T201 - the readiness line the tests wait for
    stop.wait()
    queue.shutdown()
    return 0


def dispatch_ledger_jobs(queue: Any, name: str, count: int, **fields: Any) -> list[str]:
    return queue.dispatch_many([LedgerJob(name, n, **fields) for n in range(count)])


class Workers:
    """Worker processes (``python -m tests.dbworker``) on one queue; stopped at the end, killed if need be.

    ``options`` become the worker's command-line options (``ledger_url`` is ``--ledger-url``).
    """

    def __init__(self, url: str, queue: str, *, table: str = "syncjobs_test_jobs", **options: Any) -> None:
        self.url, self.queue, self.table, self.options = url, queue, table, options
        self.procs: list[subprocess.Popen[str]] = []
        # Logs go to files, not pipes: a process that logs a lot during an
        # outage must never block on a full pipe nobody reads until the end.
        self._logs: list[IO[str]] = []
        self._stopped_logs: dict[int, str] = {}

    def spawn(self, *, wait_ready: bool = True) -> subprocess.Popen[str]:
        """Start a worker process; with ``wait_ready``, once it says it takes work.

        Without it, for a worker that may die of its first job before it can say so.
        """
        args = [sys.executable, "-m", "tests.dbworker", self.url, self.queue, "--table", self.table]
        for key, value in self.options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        log = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 - closed by stop()
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        self.procs.append(proc)  # stopped by stop() even if it never says ready
        self._logs.append(log)
        assert proc.stdout is not None
        if not wait_ready:
            return proc
        line = proc.stdout.readline()  # blocks until the worker takes work (pytest-timeout bounds it)
        if line != "ready\n":
            proc.wait(timeout=10)  # it closed its stdout: it has exited, and its log is complete
            raise AssertionError(f"the worker exited with {proc.returncode} before it was ready:\n{self._read(log)}")
        return proc

    def log(self, proc: subprocess.Popen[str]) -> str:
        """What a live worker process has logged so far."""
        return self._read(self._logs[self.procs.index(proc)])

    @staticmethod
    def _read(log: IO[str]) -> str:
        if log.closed:
            return ""
        log.seek(0)
        return log.read()

    def stop(self, timeout: float = 20.0) -> list[str]:
        """SIGTERM every live worker; their stderr (logs) once they exit (killed after ``timeout``)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc, log in zip(self.procs, self._logs, strict=True):
            try:
                proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            if not log.closed:
                self._stopped_logs[proc.pid] = self._read(log)
                log.close()
        return [self._stopped_logs[proc.pid] for proc in self.procs]


if __name__ == "__main__":
    sys.exit(main())
