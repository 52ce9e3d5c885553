"""The README's main job: a few hundred mixed jobs through a real worker pool.

It runs on the embedded default, SQLite in a temporary file, unless given a
URL. Some jobs fail and are retried (with a short, overridden backoff so the
demo takes seconds), one is a permanent failure that becomes a dead letter,
and a ``ContextVar`` set by the "request" travels into every job.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import random
import sys
import tempfile
import threading
import time
import uuid
from typing import TextIO

from .cli.inspect import print_stats
from .cli.logs import use_colour
from .context import RunInfo, current_job
from .database import DatabaseJobQueue
from .database.admin import Stats
from .envelope import DeadLetter
from .errors import Fatal, Retryable
from .job import Job
from .memory import InMemoryJobQueue
from .protocols import JobQueue
from .urls import mask_url

# The demo's run id reaches the jobs the way a request id would: through the
# context captured at dispatch (a database queue carries it as JSON), and
# names the tracker that counts what they report.
_demo_run: contextvars.ContextVar[str] = contextvars.ContextVar("syncjobs_demo_run")
_TRACKERS: dict[str, Tracker] = {}


class Tracker:
    """Counts what the jobs report, for the progress line and the summary."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.done = 0
        self.runs = 0
        self.dead: list[DeadLetter] = []
        self._failing: set[str] = set()

    def ran(self, ok: bool) -> None:
        info = _run_info()
        with self._lock:
            self.runs += 1
            if ok:
                self.done += 1
                self._failing.discard(info.id)
            else:
                self._failing.add(info.id)

    def dead_letter(self, dead: DeadLetter) -> None:
        with self._lock:
            self.dead.append(dead)
            self._failing.discard(dead.job_id)

    @property
    def retrying(self) -> int:
        with self._lock:
            return len(self._failing)


def _tracker() -> Tracker:
    return _TRACKERS[_demo_run.get()]


def _run_info() -> RunInfo:
    info = current_job()
    if info is None:
        raise RuntimeError("the demo's jobs run only inside a queue's worker")
    return info


def _work(seconds: float) -> None:
    # Stands in for I/O (an SMTP call, an HTTP request); stops early at shutdown.
    info = _run_info()
    info.cancelled.wait(seconds)


@dataclasses.dataclass
class SendWelcomeEmail(Job):
    NAME = "demo.send_welcome_email"
    user_id: int

    def run(self) -> None:
        _work(0.004 + (self.user_id % 7) / 1000)
        _tracker().ran(ok=True)


@dataclasses.dataclass
class ResizeImage(Job):
    """Fails its first ``flaky_runs`` runs with a transient error."""

    NAME = "demo.resize_image"
    image_id: int
    flaky_runs: int = 0

    def run(self) -> None:
        info = _run_info()
        _work(0.008)
        if info.attempt < self.flaky_runs:
            _tracker().ran(ok=False)
            raise Retryable("thumbnail service busy")
        _tracker().ran(ok=True)

    def retry_wait(self, failed_attempt: int) -> float:
        # The default waits 1, 2, 4 ... seconds; a demo has no time for that.
        return 0.1 * 2.0**failed_attempt


@dataclasses.dataclass
class CallSlowApi(Job):
    """Times out on its first run: any exception is a failed run, retried."""

    NAME = "demo.call_slow_api"
    request_id: int

    def run(self) -> None:
        info = _run_info()
        _work(0.012)
        if info.attempt == 0 and self.request_id % 5 == 0:
            _tracker().ran(ok=False)
            raise TimeoutError("the API took too long")
        _tracker().ran(ok=True)

    def retry_wait(self, failed_attempt: int) -> float:
        return 0.2


@dataclasses.dataclass
class ChargeCard(Job):
    """A permanent failure: dead-lettered at once, never retried."""

    NAME = "demo.charge_card"
    order_id: int

    def run(self) -> None:
        _tracker().ran(ok=False)
        raise Fatal(f"card declined for order {self.order_id}")


def make_jobs(count: int, rng: random.Random) -> list[Job]:
    jobs: list[Job] = [ChargeCard(order_id=1001)]
    for i in range(count - 1):
        kind = i % 3
        if kind == 0:
            jobs.append(SendWelcomeEmail(user_id=i))
        elif kind == 1:
            jobs.append(ResizeImage(image_id=i, flaky_runs=rng.choice((0, 0, 0, 1, 2))))
        else:
            jobs.append(CallSlowApi(request_id=i))
    rng.shuffle(jobs)
    return jobs


class _ProgressSafeHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Prints log records on a line of their own, clearing the live progress line first."""

    def __init__(self, stream: TextIO, live: bool) -> None:
        super().__init__(stream)
        self.live = live
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.live:
            self.stream.write("\r\033[K")
        super().emit(record)


def run_demo(
    *,
    url: str | None = None,
    jobs: int = 300,
    workers: int = 4,
    grace: float = 2.0,
    seed: int = 7,
    out: TextIO | None = None,
    log_level: str = "WARNING",
) -> int:
    """Run the demo; returns the process exit code (0 when every job ended as expected)."""
    out = out or sys.stdout
    with contextlib.ExitStack() as cleanup:
        if url is None:
            folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="syncjobs-demo-"))
            url, where, users = f"sqlite:///{folder}/jobs.db", "SQLite in a temporary file", False
        else:
            where, users = mask_url(url), True
        return _run(url, where, users, jobs=jobs, workers=workers, grace=grace, seed=seed, out=out, log_level=log_level)


def _make_queue(url: str, run_id: str, workers: int, grace: float) -> JobQueue:
    queue: JobQueue
    if url.startswith("memory:"):
        queue = InMemoryJobQueue(workers, shutdown_grace=grace)
    else:
        queue = DatabaseJobQueue(
            url,
            workers=workers,
            shutdown_grace=grace,
            queue=f"demo-{run_id}",
            table="syncjobs_demo",
            carry=[_demo_run],
            poll_interval=0.2,
        )
    for job_cls in (SendWelcomeEmail, ResizeImage, CallSlowApi, ChargeCard):
        queue.register(job_cls)
    queue.on_dead_letter(_TRACKERS[run_id].dead_letter)
    return queue


def _run(
    url: str,
    where: str,
    users: bool,
    *,
    jobs: int,
    workers: int,
    grace: float,
    seed: int,
    out: TextIO,
    log_level: str,
) -> int:
    """The demo on ``url``: the user's own database if ``users``, where it deletes what it made once done."""
    run_id = uuid.uuid4().hex[:12]
    tracker = _TRACKERS[run_id] = Tracker()
    queue = _make_queue(url, run_id, workers, grace)
    live = out.isatty()
    # The demo is an app: it shows the library's warnings its own way.
    handler = _ProgressSafeHandler(sys.stderr, live and sys.stderr.isatty())
    handler.setLevel(log_level)
    library_logger = logging.getLogger("syncjobs")
    library_logger.addHandler(handler)
    library_logger.setLevel(min(library_logger.getEffectiveLevel(), handler.level))
    out.write(f"syncjobs demo: {jobs} jobs, {workers} workers, on {where}\n")
    started = time.monotonic()
    interrupted = False
    snapshot = None
    token = _demo_run.set(run_id)
    try:
        queue.start()
        batch = make_jobs(jobs, random.Random(seed))
        if isinstance(queue, DatabaseJobQueue):
            queue.dispatch_many(batch)
        else:
            for job in batch:
                queue.dispatch(job)
        last_line = 0.0
        while not queue.join(timeout=0.1):
            now = time.monotonic()
            if live or now - last_line >= 1.0:
                _progress(out, tracker, queue.pending_count(), jobs, live)
                last_line = now
        if isinstance(queue, DatabaseJobQueue):
            snapshot = queue.admin.stats()  # while the workers are still live
    except KeyboardInterrupt:
        interrupted = True
        out.write(f"\ninterrupted: shutting down, running jobs get {grace:g}s\n")
    finally:
        _demo_run.reset(token)
        queue.shutdown()
        library_logger.removeHandler(handler)
    pending = queue.pending_count()
    _progress(out, tracker, pending, jobs, live)
    out.write("\n" if live else "")
    _summary(out, tracker, pending, time.monotonic() - started)
    if isinstance(queue, DatabaseJobQueue):
        _stats_then_clean_up(queue, snapshot, users, out)
    del _TRACKERS[run_id]
    if interrupted:
        return 130
    return 0 if tracker.done + len(tracker.dead) == jobs and pending == 0 else 1


def _stats_then_clean_up(queue: DatabaseJobQueue, snapshot: Stats | None, users: bool, out: TextIO) -> None:
    """The stats of the demo's queue; then, in the user's own database, its rows deleted (its tables stay)."""
    out.write(f"\n$ syncjobs stats  (table {queue.table}, queue {queue.queue_name})\n")
    print_stats(snapshot or queue.admin.stats(), False, out, only_queue=queue.queue_name)
    if users:
        deleted = queue.admin.delete_queue(queue.queue_name)
        out.write(f"\ndeleted the demo's queue {queue.queue_name} from table {queue.table}: {deleted} job(s)\n")
    queue.shutdown()  # closes the connections the counts above opened


def _summary(out: TextIO, tracker: Tracker, pending: int, elapsed: float) -> None:
    out.write(f"summary: {tracker.done} done, {len(tracker.dead)} dead, {pending} pending, ")
    out.write(f"{tracker.runs} runs in {elapsed:.2f}s\n")
    for dead in tracker.dead:
        out.write(f"  dead letter {dead.name} ({dead.job_id}) after {dead.attempts} run(s): {dead.error}\n")


def _progress(out: TextIO, tracker: Tracker, pending: int, total: int, live: bool) -> None:
    counts = f"retrying {tracker.retrying:>3} | dead {len(tracker.dead):>2} | pending {pending:>5}"
    if live:
        width = 30
        filled = width * (tracker.done + len(tracker.dead)) // max(total, 1)
        bar = "#" * filled + "." * (width - filled)
        if use_colour(out):
            bar = f"\033[32m{bar[:filled]}\033[2m{bar[filled:]}\033[0m"
        out.write(f"\r[{bar}] {tracker.done:>5}/{total} done | {counts}")
    else:
        out.write(f"done {tracker.done:>5} | {counts}\n")
    out.flush()
