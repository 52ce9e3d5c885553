"""A worker process for the multi-process tests: ``python -m tests.dbworker URL QUEUE [options]``.

Its jobs write a ledger row per run (job number, attempt, pid) in the same
database, so that a test can tell exactly which process ran what. It prints
``ready`` once it takes work, and stops gracefully on SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from typing import Any

import syncjobs
from syncjobs.database.dialects import Connector

LEDGER_TABLE = "syncjobs_test_ledger"


class Ledger:
    def __init__(self, url: str) -> None:
        self.connector = Connector(url)
        self.local = threading.local()
        mark = self.connector.dialect.placeholder
        self.insert = f"INSERT INTO {LEDGER_TABLE} (queue, n, attempt, pid) VALUES ({mark}, {mark}, {mark}, {mark})"

    def create(self) -> None:
        conn = self.connector.connect()
        cursor = conn.cursor()
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (queue VARCHAR(100), n INTEGER, attempt INTEGER, pid INTEGER)"
        )
        cursor.close()
        conn.close()

    def record(self, queue: str, n: int, attempt: int) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = self.connector.connect()
        cursor = conn.cursor()
        cursor.execute(self.insert, (queue, n, attempt, os.getpid()))
        cursor.close()

    def runs(self, queue: str) -> list[tuple[int, int, int]]:
        conn = self.connector.connect()
        cursor = conn.cursor()
        mark = self.connector.dialect.placeholder
        cursor.execute(f"SELECT n, attempt, pid FROM {LEDGER_TABLE} WHERE queue = {mark} ORDER BY n, attempt", (queue,))
        rows = [(int(n), int(a), int(p)) for n, a, p in cursor.fetchall()]
        cursor.close()
        conn.close()
        return rows


class _Process:
    """This worker process's ledger, set by main()."""

    ledger: Ledger | None = None


@dataclasses.dataclass
class LedgerJob(syncjobs.Job):
    """Records its run, then works for ``seconds`` (attempt 0) and fails as told."""

    NAME = "tests.ledger"
    queue: str
    n: int
    seconds: float = 0.0
    fatal_on_retry: bool = False

    def run(self) -> None:
        info = syncjobs.current_job()
        ledger = _Process.ledger
        assert info is not None
        assert ledger is not None
        ledger.record(self.queue, self.n, info.attempt)
        if info.attempt > 0 and self.fatal_on_retry:
            raise syncjobs.Fatal("second run")
        if self.seconds and info.attempt == 0:
            # Plain blocking work that does not look at the cancel token, as a
            # slow API call would; only a killed or stopped process interrupts it.
            threading.Event().wait(self.seconds)


class OnceLedgerJob(LedgerJob):
    """A ledger job with one run in all."""

    NAME = "tests.ledger_once"
    MAX_ATTEMPTS = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("--table", default="syncjobs_test_jobs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--grace", type=float, default=5.0)
    args = parser.parse_args(argv)
    _Process.ledger = Ledger(args.url)
    queue = syncjobs.DatabaseJobQueue(
        args.url,
        workers=args.workers,
        queue=args.queue,
        table=args.table,
        lease=args.lease,
        shutdown_grace=args.grace,
        poll_interval=0.2,
    )
    queue.register(LedgerJob)
    queue.register(OnceLedgerJob)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    queue.start()
    print("ready", flush=True)  # noqa: T201 - the readiness line the tests wait for
    stop.wait()
    queue.shutdown()
    return 0


def dispatch_ledger_jobs(queue: Any, name: str, count: int, **fields: Any) -> list[str]:
    return queue.dispatch_many([LedgerJob(name, n, **fields) for n in range(count)])


if __name__ == "__main__":
    sys.exit(main())
