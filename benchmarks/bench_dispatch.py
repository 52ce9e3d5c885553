"""``dispatch()`` against a bare INSERT + commit of the same row, taking turns in one run.

    python benchmarks/bench_dispatch.py [--db postgresql,mysql,sqlite] [--calls 2000] [--repeat 3]

Per database: a ``DatabaseJobQueue(workers=0)`` dispatches a no-op job, one
``dispatch()`` a call; beside it, on a connection of its own, one autocommitted
``INSERT`` of the same columns into the same table (the id from
``uuid4()``, the payload from ``json.dumps``). The two take turns call by
call, so a slow spell of the machine hits both. Shown: each one's median
time of a call, and their ratio (goal on PostgreSQL: at most 1.2x). In the
same turns, a unique job's ``dispatch()`` (``UNIQUE = Unique("user_id")``):
with a key no job holds (each call a new one), and a duplicate (a key held).

Then dispatch throughput while workers run: ``--calls`` ``dispatch()`` calls
from one thread on a queue no worker serves, then (once 2 worker processes of
4 threads, ``bench_database.py``'s at the default ``poll_interval``, have
drained those) as many again while the workers run them as they come. Shown:
both rates and their ratio (goal: at least 0.8x).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import bench_database as bench

import syncjobs
from syncjobs.database.dialects import Connector
from syncjobs.database.schema import COMPANIONS

TABLE = "syncjobs_bench_dispatch"
PAYLOAD = {"user_id": 12345, "template": "welcome", "locale": "en"}
URLS = {"postgresql": "postgresql://postgres@127.0.0.1:5432/test", "mysql": "mysql://root@127.0.0.1:3306/test"}


@dataclasses.dataclass
class Noop(syncjobs.Job):
    NAME = "bench.dispatch_noop"
    user_id: int
    template: str
    locale: str

    def run(self) -> None:
        pass


@dataclasses.dataclass
class UniqueNoop(Noop):
    NAME = "bench.dispatch_unique"
    UNIQUE = syncjobs.Unique("user_id")


def medians_us(calls: dict[str, Callable[[], object]], count: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():  # warm: connections open, statements prepared
        for _ in range(100):
            call()
    for _ in range(count):
        for name, call in calls.items():
            began = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) * 1e6 for name, values in samples.items()}


def measure(url: str, count: int) -> dict[str, float]:
    queue = syncjobs.DatabaseJobQueue(url, table=TABLE, workers=0)
    queue.register(Noop)
    queue.register(UniqueNoop)
    queue.install_schema()
    connector = Connector(url)
    conn = connector.connect()
    mark = connector.dialect.placeholder
    now = connector.dialect.now
    insert = (
        f"INSERT INTO {TABLE} (id, queue, name, payload, context, state, attempt, max_attempts, run_at, created_at) "  # noqa: S608
        f"VALUES ({mark}, {mark}, {mark}, {mark}, NULL, 'queued', 0, 3, {now}, {now})"
    )
    job = Noop(**PAYLOAD)

    def bare() -> None:
        cursor = conn.cursor()
        cursor.execute(insert, (str(uuid.uuid4()), "default", Noop.NAME, json.dumps(PAYLOAD)))
        cursor.close()

    keys = iter(range(10**9))
    held = UniqueNoop(**PAYLOAD)
    calls = {
        "dispatch": lambda: queue.dispatch(job),
        "bare": bare,
        "unique": lambda: queue.dispatch(UniqueNoop(next(keys), "welcome", "en")),
        "duplicate": lambda: queue.dispatch(held),
    }
    try:
        return medians_us(calls, count)
    finally:
        queue.shutdown()
        cursor = conn.cursor()
        for suffix in ("", *COMPANIONS):
            cursor.execute(f"DROP TABLE IF EXISTS {TABLE}{suffix}")
        conn.close()


def dispatch_rate(queue: syncjobs.DatabaseJobQueue, count: int) -> float:
    began = time.perf_counter()
    for _ in range(count):
        queue.dispatch(bench.NOOP)
    return count / (time.perf_counter() - began)


def with_workers(url: str, count: int, tmp: Path) -> tuple[float, float]:
    """Dispatches a second from one thread: with no worker, then with 2 worker processes draining the queue."""
    connector = Connector(url)
    queue = bench.fresh_queue(connector, "dispatch", bench.Noop)
    notes: list[str] = []
    args = [
        ["--worker", url, queue.queue_name, str(tmp / f"{queue.queue_name}-{i}"), "--poll-interval", "1.0"]
        for i in range(bench.PROCESSES)
    ]
    try:
        alone = dispatch_rate(queue, count)
        with bench.spawned(args, tmp, queue.queue_name, notes) as workers:

            def drained() -> None:
                bench.wait_drained(
                    queue.pending_count, workers, began=time.perf_counter(), timeout=600, what="drain", may_exit=False
                )

            drained()
            beside = dispatch_rate(queue, count)
            drained()
    finally:
        queue.shutdown()
        bench.drop_tables(connector)
        for note in notes:
            print(f"  note: {note}", flush=True)
    return alone, beside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql,mysql,sqlite")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgresql-url", default=URLS["postgresql"])
    parser.add_argument("--mysql-url", default=URLS["mysql"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls = {"postgresql": args.postgresql_url, "mysql": args.mysql_url}
        urls["sqlite"] = f"sqlite:///{Path(tmp) / 'dispatch.db'}"
        for db in args.db.split(","):
            print(f"{db}: one call at a time, median of {args.calls:,}, {args.repeat} runs", flush=True)
            for _ in range(args.repeat):
                figures = measure(urls[db], args.calls)
                ratio = figures["dispatch"] / figures["bare"]
                print(
                    f"  dispatch() {figures['dispatch']:7.1f} us   bare INSERT + commit {figures['bare']:7.1f} us"
                    f"   {ratio:.2f}x",
                    flush=True,
                )
                print(
                    f"    unique: a new key {figures['unique']:7.1f} us ({figures['unique'] / figures['dispatch']:.2f}x"
                    f" dispatch()), a duplicate {figures['duplicate']:7.1f} us",
                    flush=True,
                )
            print(f"{db}: {args.calls:,} dispatch() calls from one thread, alone and beside 2 worker processes")
            for _ in range(args.repeat):
                alone, beside = with_workers(urls[db], args.calls, Path(tmp))
                print(
                    f"  alone {alone:8,.0f}/s   beside workers {beside:8,.0f}/s   {beside / alone:.2f}x"
                    f"  [{bench._verdict(beside / alone >= 0.8)}]",
                    flush=True,
                )


if __name__ == "__main__":
    main()
