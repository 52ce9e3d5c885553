"""The resident memory of a worker process as it runs many jobs: it must level off.

    python benchmarks/bench_rss.py [--db sqlite,postgresql,mysql] [--jobs 500000] [--every 100000]

Per database, one worker process (``DatabaseJobQueue(workers=4)``, this file
run with a hidden ``--worker`` subcommand) runs ``--jobs`` no-op jobs, which
this process dispatches with ``dispatch_many()`` ``--every`` jobs at a time,
the next lot once the last is done. After each lot the worker reports its
resident set size (``/proc/self/statm``, Linux). Shown: RSS after each lot,
and its growth from the first lot to the last (goal: within 2 MiB).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import syncjobs
from syncjobs.database.dialects import Connector

TABLE = "syncjobs_bench_rss"
URLS = {
    "sqlite": None,  # a file in a temporary directory
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}
_runs = itertools.count(1)


@dataclasses.dataclass
class Noop(syncjobs.Job):
    NAME = "bench.rss_noop"
    user_id: int

    def run(self) -> None:
        next(_runs)


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker_main(url: str, queue_name: str) -> int:
    """Run jobs; on each line from stdin, print the RSS and the runs so far."""
    queue = syncjobs.DatabaseJobQueue(url, table=TABLE, queue=queue_name, workers=4)
    queue.register(Noop)
    queue.start()
    print("ready", flush=True)
    for reports, _ in enumerate(sys.stdin):
        # next() is the one atomic read of the count; it takes one more each time.
        print(f"{rss_mib():.2f} {next(_runs) - 1 - reports}", flush=True)
    queue.shutdown()
    return 0


def measure(url: str, jobs: int, every: int) -> list[tuple[int, float]]:
    name = f"rss-{uuid.uuid4().hex[:8]}"
    queue = syncjobs.DatabaseJobQueue(url, table=TABLE, queue=name, workers=0)
    queue.register(Noop)
    queue.install_schema()
    worker = subprocess.Popen(  # noqa: S603 - this file, with the benchmark's own arguments
        [sys.executable, __file__, "--worker", url, name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert worker.stdin is not None
    assert worker.stdout is not None
    samples = []
    try:
        if worker.stdout.readline() != "ready\n":
            raise SystemExit("the worker did not start")
        done = 0
        while done < jobs:
            for start in range(0, every, 10_000):
                queue.dispatch_many([Noop(n) for n in range(start, min(every, start + 10_000))])
            if not queue.join(600):
                raise SystemExit(f"{every} jobs not done within 600 s")
            done += every
            worker.stdin.write("\n")
            worker.stdin.flush()
            rss, runs = worker.stdout.readline().split()
            if int(runs) != done:
                raise SystemExit(f"the worker ran {runs} jobs, {done} were dispatched")
            samples.append((done, float(rss)))
            print(f"    after {done:>9,} jobs: {float(rss):7.2f} MiB", flush=True)
    finally:
        worker.stdin.close()
        worker.wait(60)
        queue.shutdown()
        conn = Connector(url).connect()
        try:
            for suffix in ("", "_schema", "_workers", "_done", "_finished"):
                conn.cursor().execute(f"DROP TABLE IF EXISTS {TABLE}{suffix}")
        finally:
            conn.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="sqlite,postgresql,mysql")
    parser.add_argument("--jobs", type=int, default=500_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--postgresql-url", default=URLS["postgresql"])
    parser.add_argument("--mysql-url", default=URLS["mysql"])
    parser.add_argument("--worker", nargs=2, metavar=("URL", "QUEUE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.exit(worker_main(*args.worker))
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "sqlite": f"sqlite:///{Path(tmp) / 'rss.db'}",
            "postgresql": args.postgresql_url,
            "mysql": args.mysql_url,
        }
        for db in args.db.split(","):
            print(f"{db}: one worker process of 4 threads, {args.jobs:,} jobs in lots of {args.every:,}", flush=True)
            began = time.perf_counter()
            samples = measure(urls[db], args.jobs, args.every)
            growth = samples[-1][1] - samples[0][1]
            verdict = "met" if growth <= 2.0 else "NOT met"
            print(
                f"  growth from {samples[0][0]:,} to {samples[-1][0]:,} jobs: {growth:+.2f} MiB "
                f"(goal within 2 MiB: {verdict}), {time.perf_counter() - began:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
