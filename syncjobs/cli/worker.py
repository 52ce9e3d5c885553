"""``syncjobs worker``: run a pool of workers until told to stop.

The first SIGTERM or SIGINT stops claiming and gives running jobs the grace;
what still runs then is cancelled and handed back. A second signal ends the
grace at once. A signal becomes an event in a ``SimpleQueue``, posted by a
thread that reads the signal wakeup fd (see ``_SignalEvents``); the main thread
does the rest.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue as stdqueue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TextIO

from ..database import DatabaseJobQueue
from ..exit_hooks import before_threads_join
from ..queue import StoreQueue, shutdown_in_turn
from ..urls import mask_url
from ..worker import RunLimit, RunReport, log_run
from .target import CommandError, check_reachable, one_line, queue_for

logger = logging.getLogger("syncjobs.worker")

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class _Event:
    kind: str  # "signal", "max-jobs", "burst", "exit", "stopped", "request"
    signum: int = 0
    done: threading.Event | None = None
    #: A "request": why, and the exit code once stopped.
    reason: str = ""
    code: int = 0


#: ``stop(reason, code)``: stop as --max-jobs does (the grace, then hand back), then return ``code``.
StopRequest = Callable[[str, int], None]


@dataclass(frozen=True)
class OptionDefaults:
    """Where each option of a worker command takes its default from, as its --help says."""

    workers: str = "the APP queue's, else 4"
    queues: str = "the APP queue's, else 'default'"
    grace: str = "the APP queue's, else 5"
    timeout: str = "the APP queue's, else no limit"
    keep_result: str = "the APP queue's, else 600"

    @classmethod
    def from_settings(cls, setting: Callable[[str], str], grace: str = "SHUTDOWN_GRACE") -> OptionDefaults:
        """Defaults a framework's settings give: ``setting("WORKERS")`` names where WORKERS is set."""
        return cls(
            workers=f"{setting('WORKERS')}, 4 unless set",
            queues=f"{setting('QUEUES')}, ['default'] unless set",
            grace=f"{setting(grace)}, 5 unless set",
            timeout=f"{setting('TIMEOUT')}, no limit unless set",
            keep_result=f"{setting('KEEP_RESULT')}, 600 unless set",
        )


def add_arguments(parser: argparse.ArgumentParser, defaults: OptionDefaults = OptionDefaults()) -> None:
    parser.add_argument(
        "-w", "--workers", type=positive_int, help=f"worker threads per queue (default: {defaults.workers})"
    )
    parser.add_argument(
        "-q",
        "--queue",
        dest="queues",
        action="append",
        metavar="NAME",
        help="a queue to take jobs from; repeat for several, each with its own --workers threads "
        f"(default: {defaults.queues})",
    )
    parser.add_argument(
        "--grace",
        type=seconds,
        help=f"seconds running jobs get to finish after the first SIGTERM/SIGINT (default: {defaults.grace})",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        help="seconds a run may take before it is cancelled and counts as failed, for jobs without a TIMEOUT "
        f"of their own (default: {defaults.timeout})",
    )
    parser.add_argument(
        "--keep-result",
        type=seconds,
        metavar="SECONDS",
        help="seconds a finished job's record (its state and result) is kept, for jobs without a KEEP_RESULT "
        f"of their own (default: {defaults.keep_result}; 0 keeps none)",
    )
    parser.add_argument(
        "--wait-for-db",
        type=seconds,
        default=0.0,
        metavar="SECONDS",
        help="at start, keep trying to reach the database for up to SECONDS (containers that start together); "
        "default 0: say at once that it cannot be reached, and exit 1",
    )
    parser.add_argument(
        "--max-jobs", type=positive_int, metavar="N", help="exit (cleanly, with the grace) after N job runs"
    )
    parser.add_argument(
        "--burst",
        action="store_true",
        help="exit once nothing is ready to run (delayed jobs and retries waiting for their backoff stay queued)",
    )


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (needs the prometheus extra); "
        "one port per worker process",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address to serve metrics on (default 127.0.0.1; 0.0.0.0 for a Prometheus on another host "
        "or outside the container)",
    )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    names = args.queues or [None]
    queues = []
    for name in dict.fromkeys(names):
        queues.append(
            queue_for(
                app=args.app,
                url=args.url,
                imports=args.imports,
                table=args.table,
                workers=args.workers,
                queue=name,
                grace=args.grace,
                timeout=args.timeout,
                keep_result=args.keep_result,
            )
        )
    if getattr(args, "metrics_port", None) is not None:
        serve_metrics(queues, args.metrics_port, args.metrics_host)
    return serve(
        queues, max_jobs=args.max_jobs, burst=args.burst, out=out, exit_if_stuck=True, wait_for_db=args.wait_for_db
    )


def serve_metrics(queues: Sequence[StoreQueue], port: int, host: str) -> None:
    """Instrument ``queues`` and serve their metrics on ``host:port``; a ``CommandError`` if that cannot be."""
    try:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415 - the optional extra, imported when asked for

        from ..metrics import Metrics  # noqa: PLC0415
    except ImportError as exc:
        raise CommandError(f"--metrics-port: {exc}") from None
    # A registry of its own: the app's module may have made a Metrics of its own on the default one.
    metrics = Metrics(CollectorRegistry())
    for queue in queues:
        metrics.instrument(queue)
    try:
        metrics.serve(port, host)
    except OSError as exc:
        raise CommandError(f"--metrics-port: cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    logger.info("metrics at http://%s:%d/metrics", host, port)


def serve(
    queues: Sequence[StoreQueue],
    *,
    max_jobs: int | None = None,
    burst: bool = False,
    out: TextIO | None = None,
    exit_if_stuck: bool = False,
    on_ready: Callable[[StopRequest], None] | None = None,
    wait_for_db: float = 0.0,
) -> int:
    """Start ``queues``, print the readiness line, and run until a signal (or --max-jobs, --burst) stops them.

    Each database is reached once first (for up to ``wait_for_db`` seconds):
    one that cannot be is a ``CommandError``, before any worker starts.

    ``on_ready(stop)`` is called once the workers run, before the readiness
    line: any thread may call ``stop(reason, code)`` to stop them as
    --max-jobs does (a code reloader, say); signals keep their meaning during
    that stop, and serve() returns ``code`` unless a second signal cut it short.

    Off the main thread (under Django's autoreloader, say) no signal handler
    can be installed: the interpreter's exit stops the workers instead.
    ``exit_if_stuck``, for a process that is a worker and nothing else: a job
    that ignored its cancel token would keep the interpreter waiting for its
    thread forever, so the process leaves without it (``os._exit``).
    """
    out = out or sys.stdout  # looked up per call: a test runner may have replaced it
    _check_databases(queues, wait_for_db)
    if not any(q.registered_names() for q in queues):
        logger.warning(
            "no job classes are registered: this worker runs no job (each it claims is handed back for a worker "
            "that knows it, then a dead letter: --import MODULE, or an APP, names the jobs)"
        )
    events: stdqueue.SimpleQueue[_Event] = stdqueue.SimpleQueue()
    stopping = threading.Event()  # ends the --burst watcher once a stop begins
    if threading.current_thread() is not threading.main_thread():
        serving = _Serving(events)
        before_threads_join(serving.exit)
        try:
            _serve(queues, events, stopping, max_jobs=max_jobs, burst=burst, out=out, on_ready=on_ready)
            event = events.get()
            stopping.set()
            return _stop_here(queues, event, exit_if_stuck)
        finally:
            stopping.set()
            serving.over()
    signals = _SignalEvents(events)
    try:
        _serve(queues, events, stopping, max_jobs=max_jobs, burst=burst, out=out, on_ready=on_ready)
        event = events.get()
        stopping.set()
        return _stop_on_signals(queues, event, events, exit_if_stuck)
    finally:
        stopping.set()
        signals.close()


class _SignalEvents:
    """On the main thread: each SIGTERM / SIGINT as a "signal" event, whichever thread the kernel gives it to.

    A Python signal handler runs in the main thread only, and only once that
    thread runs Python code again. The main thread waits in ``events.get()``,
    which a signal wakes only if the kernel delivers it to that very thread
    while it is blocked: not one given to another thread (as any signal is
    while the main thread starts one, glibc blocking them all in the caller
    meanwhile), nor one that comes just before it blocks. Such a signal would
    wait for the next event, the end of the grace, say. The interpreter's C
    handler writes the signal number to the wakeup fd at once, in whatever
    thread took it: a thread of ours reads it and posts the event.
    """

    def __init__(self, events: stdqueue.SimpleQueue[_Event]) -> None:
        self.events = events
        # A socket pair, as set_wakeup_fd() takes on every platform.
        self.receiver, self.sender = socket.socketpair()
        self.sender.setblocking(False)  # as set_wakeup_fd() requires
        self.reader = threading.Thread(target=self._read, name="syncjobs-signals", daemon=True)
        self.reader.start()
        self.previous_fd = signal.set_wakeup_fd(self.sender.fileno())
        # The handlers only keep the default action away: the wakeup fd carries the signal.
        self.previous = {signum: signal.signal(signum, _noted) for signum in _STOP_SIGNALS}

    def _read(self) -> None:
        while data := self.receiver.recv(64):  # b"" once close() closed the other end
            for signum in data:
                if signum in _STOP_SIGNALS:  # another signal with a Python handler writes here too
                    self.events.put(_Event("signal", signum))

    def close(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self.previous_fd)
        self.sender.close()
        self.reader.join()
        self.receiver.close()


def _noted(_signum: int, _frame: FrameType | None) -> None:
    """A stop signal's Python handler: ``_SignalEvents`` has it from the wakeup fd already."""


class _Serving:
    """Off the main thread: the interpreter's exit stops the workers, if they still run then."""

    def __init__(self, events: stdqueue.SimpleQueue[_Event]) -> None:
        self.events = events
        self.lock = threading.Lock()
        self.running = True

    def exit(self) -> None:
        """The exit hook: stop as a signal would, and wait until the runs are handed back."""
        done = threading.Event()
        with self.lock:
            if not self.running:  # ended already (--burst, --max-jobs, a startup error)
                return
            self.events.put(_Event("exit", done=done))
        done.wait()

    def over(self) -> None:
        """serve() has returned: no exit hook waits for it any more."""
        with self.lock:
            self.running = False
        while True:
            try:
                event = self.events.get_nowait()
            except stdqueue.Empty:
                return
            if event.done is not None:
                event.done.set()


def _serve(
    queues: Sequence[StoreQueue],
    events: stdqueue.SimpleQueue[_Event],
    stopping: threading.Event,
    *,
    max_jobs: int | None,
    burst: bool,
    out: TextIO,
    on_ready: Callable[[StopRequest], None] | None = None,
) -> None:
    """Start the workers (and what stops them) and print the readiness line.

    The workers take no job before the line is out: no job's output or log
    line (a run, a hand-back, a dead letter) comes before the line that says
    the worker takes work.
    """
    if max_jobs:
        _count_runs(queues, max_jobs, lambda: events.put(_Event("max-jobs")))
    for queue in queues:
        queue.observe_runs(log_run)
    _start(queues)  # held: they take no job until the line is out
    if burst:
        # Before the readiness line: once it is out, the caller may end the
        # main thread, and then (Python 3.12+) no thread may start.
        try:
            threading.Thread(
                target=_watch_drained, args=(queues, stopping, events), name="syncjobs-burst", daemon=True
            ).start()
        except RuntimeError as exc:
            shutdown_in_turn(queues)
            raise CommandError(f"cannot start: {one_line(exc)}") from exc
    if on_ready is not None:
        try:
            on_ready(lambda reason, code: events.put(_Event("request", reason=reason, code=code)))
        except BaseException:
            shutdown_in_turn(queues)
            raise
    try:
        out.write(f"syncjobs worker ready: pid {os.getpid()}, {describe(queues)}\n")
        out.flush()
    except BaseException:  # a closed pipe, say: no one hears that it takes work, so it takes none
        shutdown_in_turn(queues)
        raise
    for queue in queues:
        queue.release()


def _check_databases(queues: Sequence[StoreQueue], wait: float) -> None:
    seen: set[str] = set()
    for queue in queues:
        if isinstance(queue, DatabaseJobQueue) and queue.url not in seen:
            seen.add(queue.url)
            check_reachable(queue.url, queue.connect_args, wait=wait)


def _stop_here(queues: Sequence[StoreQueue], event: _Event, exit_if_stuck: bool) -> int:
    """Off the main thread: stop in this thread, which no second signal can reach.

    The interpreter may be exiting (the main thread has ended), and then no
    new thread may start, so the queues stop one after another, here.
    """
    threads = [thread for queue in queues for thread in queue.worker_threads()]
    _log_stop(event, queues[0].shutdown_grace)
    try:
        shutdown_in_turn(queues)
        logger.info("stopped")
    finally:
        if event.done is not None:  # the exit hook waits for this; the interpreter goes on
            event.done.set()
    if event.done is None and exit_if_stuck:
        _leave_stuck(threads, event.code)
    return event.code


def _stop_on_signals(
    queues: Sequence[StoreQueue], event: _Event, events: stdqueue.SimpleQueue[_Event], exit_if_stuck: bool
) -> int:
    """On the main thread: a helper thread stops the queues, so that a second signal can cut the grace."""
    threads = [thread for queue in queues for thread in queue.worker_threads()]
    _log_stop(event, queues[0].shutdown_grace)
    stopper = threading.Thread(target=_shutdown, args=(queues, events), name="syncjobs-stopper")
    stopper.start()
    code, forced = event.code, 0
    # A requested stop (a reload) is not the operator's: their first signal
    # makes it final, keeping the grace; only a second one cuts it.
    final = event.kind != "request"
    while (later := events.get()).kind != "stopped":
        if later.kind != "signal" or forced:
            continue
        name = signal.Signals(later.signum).name
        if not final:
            final, code = True, 0
            logger.info("%s: stopping for good; running jobs keep their grace (send it again to hand them back)", name)
            continue
        forced = later.signum
        logger.warning("%s again: handing running jobs back now", name)
        for queue in queues:
            queue.end_grace()
    stopper.join()
    logger.info("stopped")
    code = 128 + forced if forced else code
    if exit_if_stuck:
        _leave_stuck(threads, code)
    return code


def _start(queues: Sequence[StoreQueue]) -> None:
    """Start every queue's workers, held; CommandError, with none left running, if one fails."""
    started: list[StoreQueue] = []
    try:
        for queue in queues:
            queue.start(held=True)
            started.append(queue)
    except Exception as exc:
        for queue in started:
            queue.shutdown(grace=0)
        raise CommandError(f"cannot start: {one_line(exc)}") from exc


def _log_stop(event: _Event, grace: float) -> None:
    if event.kind == "signal":
        logger.info(
            "%s: stopping; running jobs get %gs (send it again to hand them back at once)",
            signal.Signals(event.signum).name,
            grace,
        )
    elif event.kind == "request":
        logger.info("%s: stopping; running jobs get %gs", event.reason, grace)
    elif event.kind == "exit":
        logger.info("the interpreter is exiting: stopping; running jobs get %gs", grace)
    else:
        logger.info("%s reached: stopping; running jobs get %gs", event.kind, grace)


def describe(queues: Sequence[StoreQueue]) -> str:
    """What ``queues`` serve, for the readiness line: threads, queue names, table and masked URL."""
    first = queues[0]
    if isinstance(first, DatabaseJobQueue):
        names = ", ".join(repr(queue.queue_name) for queue in queues if isinstance(queue, DatabaseJobQueue))
        return f"{first.workers} thread(s) on queue(s) {names} of {first.table} at {mask_url(first.url)}"
    return f"{first.workers} thread(s) on an in-memory queue"


def _shutdown(queues: Sequence[StoreQueue], events: stdqueue.SimpleQueue[_Event]) -> None:
    try:
        threads = [threading.Thread(target=queue.shutdown, name="syncjobs-shutdown") for queue in queues]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        events.put(_Event("stopped"))


def _watch_drained(
    queues: Sequence[StoreQueue], stopping: threading.Event, events: stdqueue.SimpleQueue[_Event]
) -> None:
    # A look every poll interval; a job finishing here (or, on PostgreSQL,
    # anywhere) wakes it sooner, but it looks at most every 20 ms.
    interval = 0.2
    while not stopping.is_set():
        if stopping.wait(0.02):
            return
        try:
            if all(queue.drained() for queue in queues):
                events.put(_Event("burst"))
                return
        except Exception:
            if stopping.is_set():  # the stores are closing under it: nothing left to watch
                return
            logger.exception("checking whether the queue is empty failed; trying again")
        queues[0].wait_finished(interval)


def _count_runs(queues: Sequence[StoreQueue], limit: int, reached: Callable[[], None]) -> None:
    """Begin at most ``limit`` runs in all (counted as they are claimed); ``reached()`` once they have ended."""
    lock = threading.Lock()
    runs = 0

    def stop_claiming() -> None:
        # From the worker thread that took the last allowed run: the other
        # workers take no new job, and a job one of them claimed goes back.
        for queue in queues:
            queue.stop_claiming()

    def count(_report: RunReport) -> None:
        nonlocal runs
        with lock:
            runs += 1
            if runs != limit:
                return
        reached()

    allowed = RunLimit(limit, stop_claiming)
    for queue in queues:
        queue.limit_runs(allowed)
        queue.observe_runs(count)


def _leave_stuck(workers: list[threading.Thread], code: int, bound: float = 1.0) -> None:
    """Exit now if a worker thread is still in a job that ignored its cancel token.

    Idle worker threads are leaving already; they get ``bound`` seconds.
    """
    deadline = time.monotonic() + bound
    for thread in workers:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [thread for thread in workers if thread.is_alive()]
    if stuck:
        logger.warning("%d job(s) ignored cancellation; exiting without them", len(stuck))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port_number(text: str) -> int:
    return _port(text, lowest=1)


def port_or_any(text: str) -> int:
    """A port number, or 0: any free port."""
    return _port(text, lowest=0)


def _port(text: str, *, lowest: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not lowest <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from {lowest} to 65535, got {value}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return value
