"""``dispatch()`` against a bare INSERT + commit of the same row, taking turns in one run.

    python benchmarks/bench_dispatch.py [--db postgresql,mysql,sqlite] [--calls 2000] [--repeat 3]

Per database: a ``DatabaseJobQueue(workers=0)`` dispatches a no-op job, one
``dispatch()`` a call; beside it, on a connection of its own, one autocommitted
``INSERT`` of the same columns into the same table (the id from
``uuid4()``, the payload from ``json.dumps``). The two take turns call by
call, so a slow spell of the machine hits both. Shown: each one's median
time of a call, and their ratio (goal on PostgreSQL: at most 1.2x).
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

import syncjobs
from syncjobs.database.dialects import Connector

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

    try:
        return medians_us({"dispatch": lambda: queue.dispatch(job), "bare": bare}, count)
    finally:
        queue.shutdown()
        cursor = conn.cursor()
        for suffix in ("", "_schema", "_workers", "_done", "_finished"):
            cursor.execute(f"DROP TABLE IF EXISTS {TABLE}{suffix}")
        conn.close()


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


if __name__ == "__main__":
    main()
