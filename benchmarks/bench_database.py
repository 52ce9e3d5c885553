"""Throughput and pickup latency of ``DatabaseJobQueue``, against a raw SQL floor in the same run.

    python benchmarks/bench_database.py [--db sqlite,postgresql,mysql] [--jobs 20000] [--repeat 1]

Per database (SQLite in a temporary directory, PostgreSQL, MariaDB/MySQL; a
server that does not answer is skipped with a note), one phase after the
other, each on a fresh queue name and on the dedicated tables
``syncjobs_bench_jobs`` and ``syncjobs_bench_floor``, which are dropped before
each phase so that every phase starts from an empty, freshly created table:

- enqueue: ``--jobs`` no-op jobs with one ``dispatch()`` each (one autocommit
  INSERT a job), then as many with ``dispatch_many()`` in chunks of
  ``--chunk`` (one transaction a chunk); from this process, with no workers.
- end to end: 2 worker processes (this file, run with a hidden ``--worker``
  subcommand) of 4 threads each start on an empty queue and say ``ready``;
  then one ``dispatch_many()`` inserts all ``--jobs`` jobs in ONE transaction,
  so no worker sees a job before all of them are in the table.  Timed from
  the return of that call until ``pending_count()``, looked at every 20 ms,
  reads 0.  Each worker counts its runs, which must add up to ``--jobs``.
- the raw SQL floor, timed the same way: 2 bare processes say ``ready``; as
  many rows go into a plain table of the same columns (id, queue, name,
  payload, state, run_at; a primary key and no other index) in one
  transaction; the processes are told to go and each loops, 50 rows a
  transaction, until a claim finds nothing.  PostgreSQL and MySQL:
  ``BEGIN; SELECT id, payload ... ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED;
  DELETE ... WHERE id IN (...); COMMIT``.  SQLite (WAL, synchronous=NORMAL,
  busy_timeout, as syncjobs connects): ``BEGIN IMMEDIATE; UPDATE ... SET
  state = 'running' WHERE id IN (SELECT id ... LIMIT 50) RETURNING id,
  payload; DELETE those; COMMIT``.  Timed until ``COUNT(*)`` reads 0.
- pickup latency: 2 fresh worker processes of 4 threads on an empty queue;
  this process dispatches 200 jobs at 100 a second, each carrying its
  ``time.time()`` at dispatch; the job's ``run()`` takes ``time.time()``
  minus that (a wall clock, as it crosses processes), and each worker process
  writes its figures to a file at exit.  The workers poll at the default
  interval (1 s): PostgreSQL's NOTIFY, or on SQLite and MySQL a datagram to
  each worker process on this host, wakes them.

Each throughput figure is one run, or the median of ``--repeat`` runs, the
floor and syncjobs taking turns; the ratio to the floor is the figure that
holds on a noisy machine.  The 20 ms look at the count runs in this process,
on the same machine, for syncjobs and the floor alike.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import queue as stdqueue
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import syncjobs
from syncjobs.database.dialects import MYSQL, SQLITE, Connector, Dialect
from syncjobs.database.schema import COMPANIONS
from syncjobs.ids import new_job_id

TABLE = "syncjobs_bench_jobs"
FLOOR_TABLE = "syncjobs_bench_floor"
PROCESSES = 2
THREADS = 4
#: status() calls timed after an end-to-end run, on random done jobs.
STATUS_LOOKS = 500
FLOOR_BATCH = 50
LATENCY_JOBS = 200
LATENCY_RATE = 100.0
#: How often this process looks at the count of jobs left.
LOOK_EVERY = 0.02
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
DATABASES = ("sqlite", "postgresql", "mysql")
#: A name per run, so that two runs, or a phase and the next, never share a queue.
RUN_ID = uuid.uuid4().hex[:8]


class Goal(NamedTuple):
    jobs_per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None


GOALS = {
    "sqlite": Goal(10_000, p50_ms=10.0, p99_ms=50.0),
    "postgresql": Goal(10_000, p50_ms=3.0, p99_ms=15.0),
    "mysql": Goal(5_000, p50_ms=50.0, p99_ms=100.0),
}
#: DatabaseJobQueue's own default: pickup is measured as a user gets it.
DEFAULT_POLL_INTERVAL = 1.0


class BenchError(Exception):
    """The benchmark could not measure: a worker died, a wait timed out, jobs went missing."""


# -- the jobs, as the worker processes run them -------------------------------


class _InWorker:
    """This worker process's tallies, kept by the jobs' ``run()``."""

    noops: ClassVar[itertools.count[int]] = itertools.count()
    lock: ClassVar[threading.Lock] = threading.Lock()
    latencies: ClassVar[list[float]] = []


@dataclasses.dataclass
class Noop(syncjobs.Job):
    NAME = "bench.noop"
    user_id: int
    template: str
    locale: str

    def run(self) -> None:
        next(_InWorker.noops)  # a count, so that a lost or doubled job shows


@dataclasses.dataclass
class Stamp(syncjobs.Job):
    """Notes, in the worker process, the wall-clock seconds since its dispatch."""

    NAME = "bench.stamp"
    sent: float

    def run(self) -> None:
        waited = time.time() - self.sent
        with _InWorker.lock:
            _InWorker.latencies.append(waited)


NOOP = Noop(user_id=12345, template="welcome", locale="en")


def _stop_event() -> threading.Event:
    """Set on SIGTERM, or when stdin closes: a worker does not outlive the benchmark that started it."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, name="bench-stdin", daemon=True).start()
    return stop


def worker_main(url: str, queue_name: str, latency_file: str, poll_interval: float, keep_result: float) -> int:
    """A syncjobs worker process: ``ready`` once it takes work, ``ran NOOPS STAMPS`` after its shutdown."""
    jobs = syncjobs.DatabaseJobQueue(
        url, workers=THREADS, queue=queue_name, table=TABLE, poll_interval=poll_interval, keep_result=keep_result
    )
    jobs.register(Noop)
    jobs.register(Stamp)
    stop = _stop_event()
    jobs.start()
    print("ready", flush=True)
    stop.wait()
    jobs.shutdown()
    with _InWorker.lock:
        latencies = list(_InWorker.latencies)
    Path(latency_file).write_text("".join(f"{seconds!r}\n" for seconds in latencies))
    print(f"ran {next(_InWorker.noops)} {len(latencies)}", flush=True)
    return 0


def _floor_claim(dialect: Dialect, cursor: Any) -> Callable[[], int]:
    """One claim-and-delete transaction of up to FLOOR_BATCH rows; returns how many it took."""
    if dialect is SQLITE:
        claim = dialect.sql(
            "UPDATE {table} SET state = 'running' WHERE id IN "
            "(SELECT id FROM {table} WHERE state = 'queued' ORDER BY id LIMIT ?) RETURNING id, payload",
            FLOOR_TABLE,
        )
    else:
        claim = dialect.sql(
            "SELECT id, payload FROM {table} WHERE state = 'queued' ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
            FLOOR_TABLE,
        )
    delete = dialect.sql("DELETE FROM {table} WHERE id IN ({ids})", FLOOR_TABLE)

    def take() -> int:
        cursor.execute(dialect.begin)
        try:
            cursor.execute(claim, (FLOOR_BATCH,))
            ids = [row[0] for row in cursor.fetchall()]
            if ids:
                cursor.execute(delete.replace("{ids}", ", ".join([dialect.placeholder] * len(ids))), ids)
        except BaseException:
            with contextlib.suppress(Exception):
                cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")
        return len(ids)

    return take


def floor_main(url: str) -> int:
    """A bare floor process: ``ready``, waits for ``go`` on stdin, empties the table, ``ran ROWS RETRIES``."""
    connector = Connector(url)
    conn = connector.connect()
    try:
        take = _floor_claim(connector.dialect, conn.cursor())
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 0
        deleted = retried = 0
        while True:
            try:
                taken = take()
            except Exception as exc:
                if not _is_deadlock(exc):
                    raise
                retried += 1  # what any claim loop on this database must do: roll back, go again
                continue
            if not taken:
                break
            deleted += taken
    finally:
        conn.close()
    print(f"ran {deleted} {retried}", flush=True)
    return 0


def _is_deadlock(exc: BaseException) -> bool:
    """MySQL's deadlock or lock wait timeout; PostgreSQL's deadlock or serialization failure."""
    return exc.args[:1] in [(1213,), (1205,)] or getattr(exc, "sqlstate", None) in ("40P01", "40001")


# -- worker processes, from the benchmark's side ------------------------------


class Worker:
    """A subprocess running this file with a hidden subcommand; its stdout read line by line."""

    def __init__(self, args: Sequence[str], stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        with stderr_path.open("w") as stderr:
            self.proc = subprocess.Popen(  # noqa: S603 - this very file, run by this interpreter
                [sys.executable, os.path.abspath(__file__), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.lines: stdqueue.Queue[str | None] = stdqueue.Queue()
        threading.Thread(target=self._read, name=f"bench-read-{self.proc.pid}", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, word: str, timeout: float) -> list[str]:
        """The rest of the next line that starts with ``word``; BenchError if none comes in time."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except stdqueue.Empty:
                raise BenchError(
                    f"worker {self.proc.pid} said no {word!r} within {timeout:.0f} s{self.tail()}"
                ) from None
            if line is None:
                self.lines.put(None)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5.0)
                raise BenchError(
                    f"worker {self.proc.pid} exited (code {self.proc.returncode}) before saying {word!r}{self.tail()}"
                )
            words = line.split()
            if words[:1] == [word]:
                return words[1:]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def check(self, may_exit: bool) -> None:
        """BenchError if the process failed, or ended when it should still run."""
        code = self.proc.poll()
        if code is not None and (code != 0 or not may_exit):
            raise BenchError(f"worker {self.proc.pid} exited with code {code}{self.tail()}")

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it is still there after STOP_TIMEOUT."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace").strip()

    def tail(self, lines: int = 30) -> str:
        text = self.stderr()
        if not text:
            return ""
        shown = "\n".join(f"      {line}" for line in text.splitlines()[-lines:])
        return f"\n    stderr of worker {self.proc.pid} (last {lines} lines at most):\n{shown}"


@contextlib.contextmanager
def spawned(args: Sequence[Sequence[str]], tmp: Path, label: str, notes: list[str]) -> Iterator[list[Worker]]:
    """One worker per ``args``, each ``ready``; every one of them stopped on the way out, whatever happens."""
    workers: list[Worker] = []
    try:
        for index, arguments in enumerate(args):
            workers.append(Worker(arguments, tmp / f"{label}-{index}.stderr"))
        for worker in workers:
            worker.expect("ready", READY_TIMEOUT)
        yield workers
    finally:
        for worker in workers:
            worker.stop()
        for worker in workers:
            if worker.stderr():
                notes.append(f"{label}: worker {worker.proc.pid} wrote to stderr{worker.tail()}")


def stop_and_count(workers: Sequence[Worker]) -> tuple[int, int]:
    """Stop every worker gracefully; the sums of their ``ran`` lines."""
    for worker in workers:
        worker.stop()
    totals = [0, 0]
    for worker in workers:
        words = worker.expect("ran", STOP_TIMEOUT)
        totals[0] += int(words[0])
        totals[1] += int(words[1])
    return totals[0], totals[1]


def wait_drained(
    left: Callable[[], int], workers: Sequence[Worker], *, began: float, timeout: float, what: str, may_exit: bool
) -> float:
    """Seconds from ``began`` until ``left()`` reads 0, looking every LOOK_EVERY seconds."""
    while True:
        count = left()
        took = time.perf_counter() - began
        if count == 0:
            return took
        if took > timeout:
            raise BenchError(f"{what}: {count:,} jobs still pending after {timeout:.0f} s; gave up")
        for worker in workers:
            worker.check(may_exit)
        time.sleep(LOOK_EVERY)  # pacing the look at the count, not a synchronisation


# -- the phases ---------------------------------------------------------------

_names = itertools.count()


def queue_name(phase: str) -> str:
    return f"bench-{RUN_ID}-{phase}-{next(_names)}"


def drop_tables(connector: Connector) -> None:
    """Drop the benchmark's tables, so that the next phase starts on fresh, empty ones."""
    conn = connector.connect()
    try:
        cursor = conn.cursor()
        for table in (TABLE, *(f"{TABLE}{suffix}" for suffix in COMPANIONS), FLOOR_TABLE):
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
    finally:
        conn.close()


def fresh_queue(connector: Connector, phase: str, job_cls: type[syncjobs.Job]) -> syncjobs.DatabaseJobQueue:
    """A queue without workers on fresh tables, its connection already open."""
    drop_tables(connector)
    jobs = syncjobs.DatabaseJobQueue(connector.url, workers=0, queue=queue_name(phase), table=TABLE)
    jobs.register(job_cls)
    jobs.install_schema()
    if jobs.pending_count() != 0:
        raise BenchError(f"the fresh queue {jobs.queue_name} is not empty")
    return jobs


def enqueue_rates(connector: Connector, count: int, chunk: int) -> tuple[float, float]:
    """Jobs a second into the table: one ``dispatch()`` each, then ``dispatch_many()`` by ``chunk``."""
    jobs = fresh_queue(connector, "enqueue", Noop)
    try:
        began = time.perf_counter()
        for _ in range(count):
            jobs.dispatch(NOOP)
        one_by_one = count / (time.perf_counter() - began)
        began = time.perf_counter()
        for start in range(0, count, chunk):
            jobs.dispatch_many([NOOP] * min(chunk, count - start))
        in_chunks = count / (time.perf_counter() - began)
        if (pending := jobs.pending_count()) != 2 * count:
            raise BenchError(f"enqueue: {2 * count:,} jobs dispatched, {pending:,} pending")
    finally:
        jobs.shutdown()
    return one_by_one, in_chunks


def end_to_end_rate(
    connector: Connector,
    count: int,
    tmp: Path,
    *,
    poll_interval: float,
    timeout: float,
    notes: list[str],
    keep_result: float = syncjobs.DEFAULT_KEEP_RESULT,
    status_ms: list[float] | None = None,
) -> float:
    """Jobs a second through 2 worker processes of 4 threads, all jobs in the table when the clock starts.

    With ``status_ms``, the median time of ``status()`` of a done job (of
    STATUS_LOOKS, on random ids, after the run) is appended to it.
    """
    jobs = fresh_queue(connector, "e2e", Noop)
    name = jobs.queue_name
    args = [
        [
            "--worker",
            connector.url,
            name,
            str(tmp / f"{name}-{i}.latency"),
            "--poll-interval",
            str(poll_interval),
            "--keep-result",
            str(keep_result),
        ]
        for i in range(PROCESSES)
    ]
    try:
        with spawned(args, tmp, name, notes) as workers:
            handles = jobs.dispatch_many([NOOP] * count)  # one transaction: all visible at once
            began = time.perf_counter()
            took = wait_drained(
                jobs.pending_count, workers, began=began, timeout=timeout, what="end to end", may_exit=False
            )
            ran, _ = stop_and_count(workers)
        dead = jobs.dead_letters()
        if status_ms is not None:
            status_ms.append(_status_ms(jobs, handles))
    finally:
        jobs.shutdown()
    if ran != count or dead:
        raise BenchError(f"end to end: {count:,} jobs dispatched, {ran:,} runs, {len(dead)} dead letters")
    return count / took


def _status_ms(jobs: syncjobs.DatabaseJobQueue, handles: Sequence[syncjobs.JobHandle]) -> float:
    """Median milliseconds of one status() of a done job, its record kept, by its id."""
    samples = []
    for handle in random.sample(list(handles), min(STATUS_LOOKS, len(handles))):
        began = time.perf_counter()
        status = jobs.status(handle)
        samples.append(time.perf_counter() - began)
        if status is None or status.state != "done":
            raise BenchError(f"status() of a done job {handle}: {status}")
    return statistics.median(samples) * 1000


def fill_floor(connector: Connector, name: str, count: int) -> None:
    """The floor's table, created afresh, with ``count`` queued rows inserted in one transaction."""
    dialect = connector.dialect
    text = "LONGTEXT" if dialect is MYSQL else "TEXT"
    engine = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4" if dialect is MYSQL else ""
    insert = dialect.sql(
        "INSERT INTO {table} (id, queue, name, payload, state, run_at) VALUES (?, ?, ?, ?, 'queued', ?)", FLOOR_TABLE
    )
    payload = json.dumps(NOOP.to_payload())
    now = time.time()
    rows = [(new_job_id(), name, Noop.NAME, payload, now) for _ in range(count)]
    conn = connector.connect()
    try:
        cursor = conn.cursor()
        cursor.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
        cursor.execute(
            f"CREATE TABLE {FLOOR_TABLE} (id {dialect.text_key} NOT NULL PRIMARY KEY, queue VARCHAR(100) NOT NULL, "
            f"name VARCHAR(200) NOT NULL, payload {text} NOT NULL, state VARCHAR(10) NOT NULL, "
            f"run_at {dialect.real} NOT NULL){engine}"
        )
        cursor.execute(dialect.begin)
        cursor.executemany(insert, rows)
        cursor.execute("COMMIT")
    finally:
        conn.close()


def floor_rate(connector: Connector, count: int, tmp: Path, *, timeout: float, notes: list[str]) -> float:
    """Rows a second through 2 bare claim-and-delete processes: the floor of any design on this table."""
    drop_tables(connector)
    name = queue_name("floor")
    conn = connector.connect()
    cursor = conn.cursor()
    count_rows = connector.dialect.sql("SELECT COUNT(*) FROM {table}", FLOOR_TABLE)

    def left() -> int:
        cursor.execute(count_rows)
        return int(cursor.fetchone()[0])

    try:
        with spawned([["--floor-worker", connector.url]] * PROCESSES, tmp, name, notes) as workers:
            fill_floor(connector, name, count)
            began = time.perf_counter()
            for worker in workers:
                worker.send("go")
            took = wait_drained(left, workers, began=began, timeout=timeout, what="raw SQL floor", may_exit=True)
            said = [worker.expect("ran", STOP_TIMEOUT) for worker in workers]
    finally:
        conn.close()
    deleted = sum(int(words[0]) for words in said)
    if retried := sum(int(words[1]) for words in said):
        notes.append(f"{name}: the floor processes rolled back and retried {retried} deadlocked transactions")
    if deleted != count:
        raise BenchError(f"raw SQL floor: {count:,} rows inserted, {deleted:,} deleted")
    return count / took


def pickup_latency_ms(
    connector: Connector, tmp: Path, *, poll_interval: float, timeout: float, notes: list[str]
) -> tuple[float, float]:
    """p50 and p99, in ms, from ``dispatch()`` in this process to ``run()`` in a worker process."""
    jobs = fresh_queue(connector, "pickup", Stamp)
    name = jobs.queue_name
    files = [tmp / f"{name}-{i}.latency" for i in range(PROCESSES)]
    args = [["--worker", connector.url, name, str(path), "--poll-interval", str(poll_interval)] for path in files]
    try:
        with spawned(args, tmp, name, notes) as workers:
            began = time.perf_counter()
            for i in range(LATENCY_JOBS):
                # Paced dispatch: the benchmark's own clock, not a synchronisation.
                pause = began + i / LATENCY_RATE - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                jobs.dispatch(Stamp(time.time()))
            wait_drained(
                jobs.pending_count,
                workers,
                began=time.perf_counter(),
                timeout=timeout,
                what="pickup latency",
                may_exit=False,
            )
            _, stamps = stop_and_count(workers)
    finally:
        jobs.shutdown()
    ordered = sorted(float(line) for path in files for line in path.read_text().split())
    if stamps != LATENCY_JOBS or len(ordered) != LATENCY_JOBS:
        raise BenchError(f"pickup latency: {LATENCY_JOBS} jobs dispatched, {stamps} runs, {len(ordered)} figures")
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


# -- one database, and the whole run ------------------------------------------


@dataclasses.dataclass
class Result:
    dispatch: float | None = None
    dispatch_many: float | None = None
    end_to_end: float | None = None
    #: End to end with keep_result=0 (no record kept), and status()'s median with them kept.
    end_to_end_unkept: float | None = None
    status_ms: float | None = None
    floor: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    failed: str | None = None


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def bench_database(db: str, url: str, args: argparse.Namespace, tmp: Path) -> Result:
    """Every phase on one database, printing each figure as it comes."""
    connector = Connector(url)
    goal = GOALS[db]
    result = Result()
    notes: list[str] = []
    try:
        result.dispatch, result.dispatch_many = enqueue_rates(connector, args.jobs, args.chunk)
        print(f"  enqueue, dispatch() one at a time     {result.dispatch:>9,.0f} jobs/s", flush=True)
        print(f"  enqueue, dispatch_many() by {args.chunk:<9,} {result.dispatch_many:>9,.0f} jobs/s", flush=True)
        floors: list[float] = []
        ends: list[float] = []
        unkept: list[float] = []
        status_ms: list[float] = []
        for _ in range(args.repeat):
            floors.append(floor_rate(connector, args.jobs, tmp, timeout=args.timeout, notes=notes))
            ends.append(
                end_to_end_rate(
                    connector,
                    args.jobs,
                    tmp,
                    poll_interval=args.poll_interval,
                    timeout=args.timeout,
                    notes=notes,
                    status_ms=status_ms,
                )
            )
            unkept.append(
                end_to_end_rate(
                    connector,
                    args.jobs,
                    tmp,
                    poll_interval=args.poll_interval,
                    timeout=args.timeout,
                    notes=notes,
                    keep_result=0.0,
                )
            )
        result.floor, result.end_to_end = statistics.median(floors), statistics.median(ends)
        result.end_to_end_unkept, result.status_ms = statistics.median(unkept), statistics.median(status_ms)
        met = _verdict(result.end_to_end >= goal.jobs_per_s)
        print(
            f"  end to end, results kept 600 s        {result.end_to_end:>9,.0f} jobs/s"
            f"   goal >= {goal.jobs_per_s:,.0f}: {met}",
            flush=True,
        )
        print(f"  end to end, keep_result=0             {result.end_to_end_unkept:>9,.0f} jobs/s", flush=True)
        print(
            f"  status() of a done job, median        {result.status_ms:>9.3f} ms    goal < 1 ms: "
            f"{_verdict(result.status_ms < 1.0)}",
            flush=True,
        )
        print(
            f"  end to end, raw SQL floor             {result.floor:>9,.0f} jobs/s"
            f"   syncjobs is {result.end_to_end / result.floor:.2f}x the floor",
            flush=True,
        )
        result.p50_ms, result.p99_ms = pickup_latency_ms(
            connector, tmp, poll_interval=DEFAULT_POLL_INTERVAL, timeout=args.timeout, notes=notes
        )
        line = (
            f"  {f'pickup, {LATENCY_JOBS} jobs at {LATENCY_RATE:.0f}/s':<38}"
            f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms"
        )
        if goal.p50_ms is not None and goal.p99_ms is not None:
            met = _verdict(result.p50_ms < goal.p50_ms and result.p99_ms < goal.p99_ms)
            line += f"   goal p50 < {goal.p50_ms:g} ms, p99 < {goal.p99_ms:g} ms: {met}"
        print(line, flush=True)
    except Exception as exc:  # noqa: BLE001 - report it, and go on to the next database
        result.failed = f"{type(exc).__name__}: {exc}"
        print(f"  FAILED: {result.failed}", flush=True)
        if not isinstance(exc, BenchError):
            print(traceback.format_exc(), flush=True)
    finally:
        for note in notes:
            print(f"  note: {note}", flush=True)
        with contextlib.suppress(Exception):
            drop_tables(connector)
    return result


def _reachable(url: str) -> str | None:
    """None if the server answers, else why not."""
    try:
        Connector(url).connect().close()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means the server is not there
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def _database_list(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(DATABASES))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose among {', '.join(DATABASES)}, comma-separated; not {unknown}")
    return chosen


def _figure(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_summary(results: dict[str, Result | None]) -> None:
    print("\nsummary (jobs/s; pickup in ms)")
    print(f"  {'database':<11}{'dispatch':>10}{'many':>10}{'e2e':>10}{'floor':>10}{'ratio':>7}{'p50':>9}{'p99':>9}")
    for db, result in results.items():
        if result is None:
            print(f"  {db:<11}  skipped: not reachable")
            continue
        ratio = None if result.end_to_end is None or result.floor is None else result.end_to_end / result.floor
        print(
            f"  {db:<11}{_figure(result.dispatch, ',.0f'):>10}{_figure(result.dispatch_many, ',.0f'):>10}"
            f"{_figure(result.end_to_end, ',.0f'):>10}{_figure(result.floor, ',.0f'):>10}"
            f"{_figure(ratio, '.2f'):>7}{_figure(result.p50_ms, '.2f'):>9}{_figure(result.p99_ms, '.2f'):>9}"
            + (f"  FAILED: {result.failed.splitlines()[0]}" if result.failed else "")
        )
    print(
        "  goals: postgresql e2e >= 10,000 jobs/s, pickup p50 < 3 ms, p99 < 15 ms; "
        "sqlite e2e >= 10,000 jobs/s; mysql e2e >= 5,000 jobs/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=_database_list, default=list(DATABASES), help="e.g. sqlite,postgresql")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=1_000, help="dispatch_many() chunk when measuring enqueue")
    parser.add_argument("--repeat", type=int, default=1, help="end-to-end and floor runs; their medians are shown")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="the end-to-end workers' poll_interval, seconds (pickup uses the default)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on a phase after this many seconds")
    parser.add_argument(
        "--postgresql-url",
        default=os.environ.get("SYNCJOBS_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument(
        "--mysql-url", default=os.environ.get("SYNCJOBS_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test")
    )
    parser.add_argument("--worker", nargs=3, metavar=("URL", "QUEUE", "LATENCY_FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--keep-result", type=float, default=syncjobs.DEFAULT_KEEP_RESULT, help=argparse.SUPPRESS)
    parser.add_argument("--floor-worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        url, name, latency_file = args.worker
        sys.exit(worker_main(url, name, latency_file, args.poll_interval, args.keep_result))
    if args.floor_worker:
        sys.exit(floor_main(args.floor_worker))
    if args.jobs < 1 or args.chunk < 1 or args.repeat < 1:
        parser.error("--jobs, --chunk and --repeat must be at least 1")

    print(
        f"{args.jobs:,} no-op jobs; {PROCESSES} worker processes x {THREADS} threads, "
        f"poll_interval {args.poll_interval:g} s; {args.repeat} end-to-end run(s), median shown"
    )
    results: dict[str, Result | None] = {}
    with tempfile.TemporaryDirectory(prefix="bench_database-") as tmpdir:
        tmp = Path(tmpdir)
        urls = {
            "sqlite": f"sqlite:///{tmp / 'jobs.db'}",
            "postgresql": args.postgresql_url,
            "mysql": args.mysql_url,
        }
        for db in args.db:
            url = urls[db]
            print(f"\n{db}  {url}", flush=True)
            if (why := _reachable(url)) is not None:
                print(f"  skipped: not reachable ({why})", flush=True)
                results[db] = None
                continue
            results[db] = bench_database(db, url, args, tmp)
    print_summary(results)


if __name__ == "__main__":
    main()
