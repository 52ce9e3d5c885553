"""What limits cost: the same drain of no-op jobs without limits, beside a limited class, and under a limit.

    python benchmarks/bench_limits.py [--db memory,sqlite,postgresql,mysql] [--jobs 5000] [--repeat 3]

Per backend, three queues of 4 worker threads drain ``--jobs`` no-op jobs,
taking turns ``--repeat`` times, so that a slow spell of the machine hits all
three; shown, each one's median jobs/s and its ratio to the first:

- *plain*: no job class declares a ``LIMIT`` (the claim looks at one flag);
- *beside*: another registered class declares one, these jobs none (the
  claim looks each job's class up: what unlimited jobs pay once any job has
  a limit; goal: within noise of plain);
- *limited*: every job under ``Limit(running=1000)``, a limit never reached
  (each claim takes permits: what a limit itself costs).

Database queues drain jobs dispatched beforehand (``dispatch_many``), one
process, the default settings otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import syncjobs
from syncjobs.database.dialects import Connector
from syncjobs.database.schema import COMPANIONS

TABLE = "syncjobs_bench_limits"
URLS = {"postgresql": "postgresql://postgres@127.0.0.1:5432/test", "mysql": "mysql://root@127.0.0.1:3306/test"}
WORKERS = 4


@dataclasses.dataclass
class Noop(syncjobs.Job):
    NAME = "bench.limits.noop"
    user_id: int

    def run(self) -> None:
        pass


@dataclasses.dataclass
class LimitedNoop(Noop):
    NAME = "bench.limits.limited_noop"
    LIMIT: ClassVar[syncjobs.Limit | None] = syncjobs.Limit(running=1000)


@dataclasses.dataclass
class Elsewhere(Noop):
    NAME = "bench.limits.elsewhere"
    LIMIT: ClassVar[syncjobs.Limit | None] = syncjobs.Limit(running=1)


def _drop(url: str) -> None:
    conn = Connector(url).connect()
    try:
        cursor = conn.cursor()
        for suffix in ("", *COMPANIONS):
            cursor.execute(f"DROP TABLE IF EXISTS {TABLE}{suffix}")
    finally:
        conn.close()


def drain(url: str | None, job_cls: type[Noop], beside: bool, jobs: int) -> float:
    """Jobs/s of one drain."""
    queue: Any
    if url is None:
        queue = syncjobs.InMemoryJobQueue(WORKERS)
    else:
        queue = syncjobs.DatabaseJobQueue(url, workers=WORKERS, table=TABLE, queue=f"q-{uuid.uuid4().hex[:8]}")
    queue.register(job_cls)
    if beside:
        queue.register(Elsewhere)
    batch = [job_cls(n) for n in range(jobs)]
    if url is None:
        with queue:
            began = time.perf_counter()
            for job in batch:
                queue.dispatch(job)
            assert queue.join(600)
            took = time.perf_counter() - began
        return jobs / took
    for start in range(0, jobs, 1000):
        queue.dispatch_many(batch[start : start + 1000])
    began = time.perf_counter()
    queue.start()
    try:
        assert queue.join(600)
        took = time.perf_counter() - began
    finally:
        queue.shutdown()
    return jobs / took


def bench(db: str, url: str | None, jobs: int, repeat: int) -> None:
    kinds: dict[str, Callable[[], float]] = {
        "plain": lambda: drain(url, Noop, False, jobs),
        "beside": lambda: drain(url, Noop, True, jobs),
        "limited": lambda: drain(url, LimitedNoop, False, jobs),
    }
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(repeat):
        for kind, run in kinds.items():
            rates[kind].append(run())
    plain = statistics.median(rates["plain"])
    for kind, got in rates.items():
        median = statistics.median(got)
        print(f"{db:11} {kind:8} {median:9.0f} jobs/s  {median / plain:5.2f}x plain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="memory,sqlite,postgresql,mysql")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for db in args.db.split(","):
            url = None if db == "memory" else URLS.get(db, f"sqlite:///{Path(tmp) / 'bench.db'}")
            if url is not None:
                _drop(url)
            try:
                bench(db, url, args.jobs if url else args.jobs * 10, args.repeat)
            finally:
                if url is not None:
                    _drop(url)


if __name__ == "__main__":
    main()
