"""``python -m tests.unique_dispatcher URL TABLE USER THREADS EACH``: dispatch one unique job many times at once.

Each thread connects first; the process prints ``ready``, waits for a line on
stdin, then every thread dispatches ``SyncUser(USER)`` EACH times and the
process prints the id each dispatch returned, one per line.
"""

from __future__ import annotations

import sys
import threading

import syncjobs
from tests.test_unique import SyncUser


def main(url: str, table: str, *, user: int, threads: int, each: int) -> None:
    queue = syncjobs.DatabaseJobQueue(url, workers=0, table=table, auto_schema=False)
    queue.register(SyncUser)
    ids: list[str] = []
    lock = threading.Lock()
    go = threading.Event()
    connected = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def dispatcher() -> None:
        try:
            queue.pending_count()  # this thread's connection, opened before the start
            connected.wait(30)
            assert go.wait(60)
            got = [str(queue.dispatch(SyncUser(user, "many"))) for _ in range(each)]
            with lock:
                ids.extend(got)
        except BaseException as exc:  # noqa: BLE001 - reported below, failing the process
            errors.append(exc)

    workers = [threading.Thread(target=dispatcher) for _ in range(threads)]
    for thread in workers:
        thread.start()
    connected.wait(30)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    go.set()
    for thread in workers:
        thread.join(90)
    queue.shutdown()
    if errors:
        raise SystemExit(f"{len(errors)} dispatcher(s) failed: {errors[0]!r}")
    sys.stdout.write("".join(f"{job_id}\n" for job_id in ids))


if __name__ == "__main__":
    url, table, user, threads, each = sys.argv[1:]
    main(url, table, user=int(user), threads=int(threads), each=int(each))
