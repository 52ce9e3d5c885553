"""A long drain in slices, and the drain rate against the backlog: neither may fall off.

    python benchmarks/bench_drain.py [--db postgresql,sqlite,mysql] [--jobs 300000] [--slice 50000]
                                     [--backlogs 0,100000,1000000] [--no-throwaway]

Two steps per database, on the table ``syncjobs_bench_jobs`` (dropped first):

- the sliced drain: ``--jobs`` no-op jobs go in with ``dispatch_many()``;
  then 2 worker processes of 4 threads (``bench_database.py``'s) drain them
  while this process reads the count of jobs done every 20 ms (the tally the
  completer keeps for ``stats``, not a COUNT of the queue). Shown: the
  rate of each ``--slice`` jobs, and the last slice's rate over the first
  (goal: at least 0.8x). On PostgreSQL also the dead tuples, autovacuum runs
  and index size at the end, and a claim on the emptied table against one on
  the fresh table.
- backlog scaling: for each ``--backlogs`` N, N + 20,000 jobs in a fresh
  table (PostgreSQL: then ``VACUUM ANALYZE``); the time to run the first
  20,000 of them. Shown: each rate over the
  rate with no backlog (goal: at least 0.8x).

PostgreSQL runs twice: on a throwaway server that this benchmark starts with
``initdb``'s defaults (autovacuum on, as a user's server is) in a temporary
directory, and on the server of ``--postgresql-url`` as it is configured
(this machine's runs with ``autovacuum = off``, where only the design helps).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import bench_claim_plan
import bench_database as bench

import syncjobs
from syncjobs.database import queries
from syncjobs.database.dialects import POSTGRES, Connector

DRAIN_SAMPLE = 20_000
FILL_CHUNK = 5_000
TIMEOUT = 1800.0


# -- a throwaway PostgreSQL server ---------------------------------------------


def _pg_tool(name: str, *args: str, check: bool = True) -> None:
    """Run a PostgreSQL server program (on PATH, or in pg_config's BINDIR); as root, as the ``postgres`` user.

    initdb and postgres refuse to run as root.
    """
    program = shutil.which(name)
    if program is None:
        config = shutil.which("pg_config")
        if config is None:
            raise bench.BenchError(f"no {name} on PATH and no pg_config to find it")
        bindir = subprocess.run([config, "--bindir"], capture_output=True, text=True, check=True).stdout  # noqa: S603
        program = str(Path(bindir.strip()) / name)
    command = [program, *args]
    if os.geteuid() == 0:
        command = ["/usr/sbin/runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, capture_output=True, check=check)  # noqa: S603 - the benchmark's own arguments


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def throwaway_postgres(tmp: Path) -> Iterator[str]:
    """A PostgreSQL server with initdb's defaults on a free port; its URL. Stopped on the way out."""
    data = tmp / "pgdata"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres")
        shutil.chown(data, "postgres")
    port = _free_port()
    _pg_tool("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync")
    options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={tmp}"
    _pg_tool("pg_ctl", "-D", str(data), "-o", options, "-l", str(tmp / "pg.log"), "-w", "start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        _pg_tool("pg_ctl", "-D", str(data), "-m", "immediate", "stop", check=False)


# -- the steps ------------------------------------------------------------------


def fill(jobs: syncjobs.DatabaseJobQueue, count: int) -> None:
    for start in range(0, count, FILL_CHUNK):
        jobs.dispatch_many([bench.NOOP] * min(FILL_CHUNK, count - start))


def _pg_table_figures(connector: Connector) -> str:
    conn = connector.connect()
    try:
        cursor = conn.cursor()
        cursor.execute(
            "SELECT n_dead_tup, autovacuum_count, n_tup_hot_upd, n_tup_upd, "
            "pg_indexes_size(relid) / 1048576.0 FROM pg_stat_user_tables WHERE relname = %s",
            (bench.TABLE,),
        )
        dead, autovacuums, hot, updates, index_mib = cursor.fetchone()
    finally:
        conn.close()
    return (
        f"dead tuples {dead:,}, autovacuum runs {autovacuums}, HOT updates {hot:,} of {updates:,}, "
        f"indexes {index_mib:.1f} MiB"
    )


def claim_ms(connector: Connector, queue_name: str) -> float:
    """The median time of a claim that finds nothing (a rolled-back CLAIM_RETURNING), milliseconds."""
    conn = connector.connect()
    try:
        return bench_claim_plan.claim_ms(
            conn.cursor(),
            POSTGRES.sql(queries.CLAIM_RETURNING, bench.TABLE),
            50,
            ("running", "bench", "token", 60.0, queue_name, 10),  # read from the start
        )
    finally:
        conn.close()


def _worker_args(connector: Connector, name: str, tmp: Path) -> list[list[str]]:
    return [
        ["--worker", connector.url, name, str(tmp / f"{name}-{i}.latency"), "--poll-interval", "0.05"]
        for i in range(bench.PROCESSES)
    ]


class DoneCounter:
    """Jobs of one queue done so far, from the table the completer adds to as it deletes finished rows.

    Not ``pending_count()``: a COUNT of a million queued rows every 20 ms
    would load the database more than the claims being measured.
    """

    def __init__(self, connector: Connector, queue_name: str) -> None:
        self._conn = connector.connect()
        self._sql = connector.dialect.sql("SELECT SUM(done) FROM {table}_done WHERE queue = ?", bench.TABLE)
        self._queue = queue_name

    def __call__(self) -> int:
        cursor = self._conn.cursor()
        cursor.execute(self._sql, (self._queue,))
        row = cursor.fetchone()
        cursor.close()
        return int(row[0] or 0) if row else 0

    def close(self) -> None:
        self._conn.close()


def _drain_marks(done: DoneCounter, workers: list[bench.Worker], marks: list[int]) -> list[tuple[float, int]]:
    """(perf_counter(), jobs done) now, and when the count first reaches each of ``marks``."""
    began = time.perf_counter()
    seen = [(began, done())]
    for mark in marks:
        while (count := done()) < mark:
            if time.perf_counter() - began > TIMEOUT:
                raise bench.BenchError(f"{count:,} jobs done after {TIMEOUT:.0f} s, not {mark:,}; gave up")
            for worker in workers:
                worker.check(may_exit=False)
            time.sleep(bench.LOOK_EVERY)  # pacing the look at the count, not a synchronisation
        seen.append((time.perf_counter(), count))
    return seen


def _rates(seen: list[tuple[float, int]]) -> list[float]:
    """Jobs a second between each two of ``seen``."""
    return [(done - before) / (at - then) for (then, before), (at, done) in itertools.pairwise(seen)]


def sliced_drain(connector: Connector, count: int, size: int, tmp: Path, notes: list[str]) -> float:
    """Print each slice's rate; return the last slice's rate over the first."""
    jobs = bench.fresh_queue(connector, "drain", bench.Noop)
    try:
        fresh_claim = claim_ms(connector, jobs.queue_name) if connector.dialect is POSTGRES else None
        fill(jobs, count)
        marks = list(range(size, count + 1, size))
        done = DoneCounter(connector, jobs.queue_name)
        try:
            with bench.spawned(_worker_args(connector, jobs.queue_name, tmp), tmp, jobs.queue_name, notes) as workers:
                seen = _drain_marks(done, workers, marks)
                ran, _ = bench.stop_and_count(workers)
        finally:
            done.close()
        if ran != count:
            raise bench.BenchError(f"drain: {count:,} jobs dispatched, {ran:,} runs")
        rates = _rates(seen)
        print("  slices: " + " -> ".join(f"{rate:,.0f}" for rate in rates) + " jobs/s", flush=True)
        if connector.dialect is POSTGRES:
            print(f"  at the end: {_pg_table_figures(connector)}", flush=True)
            print(
                f"  claim on the empty table: {claim_ms(connector, jobs.queue_name):.2f} ms "
                f"(fresh table: {fresh_claim:.2f} ms)",
                flush=True,
            )
    finally:
        jobs.shutdown()
    ratio = rates[-1] / rates[0]
    print(f"  last slice / first: {ratio:.2f}x  [{bench._verdict(ratio >= 0.8)}]", flush=True)
    return ratio


def backlog_rate(connector: Connector, backlog: int, tmp: Path, notes: list[str]) -> float:
    """Jobs a second over the first DRAIN_SAMPLE jobs drained from backlog + DRAIN_SAMPLE queued."""
    jobs = bench.fresh_queue(connector, f"backlog{backlog}", bench.Noop)
    try:
        total = backlog + DRAIN_SAMPLE
        fill(jobs, total)
        if connector.dialect is POSTGRES:
            conn = connector.connect()
            try:
                conn.cursor().execute(f"VACUUM ANALYZE {bench.TABLE}")
            finally:
                conn.close()
        done = DoneCounter(connector, jobs.queue_name)
        try:
            with bench.spawned(_worker_args(connector, jobs.queue_name, tmp), tmp, jobs.queue_name, notes) as workers:
                seen = _drain_marks(done, workers, [DRAIN_SAMPLE])
        finally:
            done.close()
    finally:
        jobs.shutdown()
    return _rates(seen)[0]


def backlog_scaling(connector: Connector, backlogs: list[int], tmp: Path, notes: list[str]) -> None:
    rates = {backlog: backlog_rate(connector, backlog, tmp, notes) for backlog in backlogs}
    base = rates[backlogs[0]]
    for backlog, rate in rates.items():
        ratio = rate / base
        print(
            f"  backlog {backlog:>9,}: {rate:>8,.0f} jobs/s  {ratio:.2f}x  [{bench._verdict(ratio >= 0.8)}]",
            flush=True,
        )


def bench_one(label: str, url: str, args: argparse.Namespace, tmp: Path) -> None:
    print(f"\n{label}  {url}", flush=True)
    if (why := bench._reachable(url)) is not None:
        print(f"  skipped: not reachable ({why})", flush=True)
        return
    connector = Connector(url)
    notes: list[str] = []
    try:
        sliced_drain(connector, args.jobs, args.slice, tmp, notes)
        if args.backlogs:
            backlog_scaling(connector, args.backlogs, tmp, notes)
    finally:
        bench.drop_tables(connector)
        for note in notes:
            print(f"  note: {note}", flush=True)


def _counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=bench._database_list, default=list(bench.DATABASES))
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--slice", type=int, default=50_000)
    parser.add_argument("--backlogs", type=_counts, default=[0, 100_000, 1_000_000])
    parser.add_argument("--no-throwaway", action="store_true", help="skip the throwaway PostgreSQL server")
    parser.add_argument(
        "--postgresql-url",
        default=os.environ.get("SYNCJOBS_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument(
        "--mysql-url", default=os.environ.get("SYNCJOBS_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test")
    )
    args = parser.parse_args()
    if args.jobs < args.slice or args.jobs % args.slice:
        parser.error("--jobs must be a multiple of --slice")
    print(
        f"{args.jobs:,} jobs in slices of {args.slice:,}; backlogs {', '.join(f'{n:,}' for n in args.backlogs)}; "
        f"{bench.PROCESSES} worker processes x {bench.THREADS} threads",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench_drain-") as tmpdir:
        tmp = Path(tmpdir)
        urls = {"sqlite": f"sqlite:///{tmp / 'jobs.db'}", "postgresql": args.postgresql_url, "mysql": args.mysql_url}
        for db in args.db:
            if db == "postgresql" and not args.no_throwaway:
                server_dir = Path(tempfile.mkdtemp(prefix="bench_drain_pg-"))
                try:
                    with throwaway_postgres(server_dir) as url:
                        bench_one("postgresql (throwaway server, initdb defaults)", url, args, tmp)
                finally:
                    shutil.rmtree(server_dir, ignore_errors=True)
            bench_one(db, urls[db], args, tmp)


if __name__ == "__main__":
    sys.exit(main())
