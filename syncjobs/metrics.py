"""Prometheus metrics of job queues: the ``prometheus`` extra (``pip install 'syncjobs[prometheus]'``).

::

    from syncjobs.metrics import Metrics

    metrics = Metrics()            # on prometheus_client's default registry
    metrics.instrument(queue)      # its dispatches and runs, and its depth read at each scrape
    metrics.serve(9100)            # or mount prometheus_client.make_wsgi_app() in the app

Counters, the histogram and the in-progress gauge are this process's: each
process serves its own (``syncjobs worker --metrics-port``), and Prometheus
sums them over its targets. The depth gauges are read at scrape time from
the queue itself: on a database, the table's rows (every process's jobs, the
same figure from each process); in memory, this process's jobs.

Label values are the queue's name and the job's ``NAME``: a payload never
reaches a label.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Hashable, Iterable, Iterator
from typing import TYPE_CHECKING

try:
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - the extra not installed
    raise ImportError("syncjobs.metrics needs prometheus_client: pip install 'syncjobs[prometheus]'") from exc

from .status import QueueCounts
from .worker import Outcome, RunReport

if TYPE_CHECKING:
    from .queue import StoreQueue

logger = logging.getLogger("syncjobs")

#: Run durations, in seconds: from a quick email to a long report.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, math.inf)

#: Seconds a depth reading serves the scrapes that follow it: a database counts with one query over the table.
DEPTH_EVERY = 5.0

_STATES = ("queued", "running", "parked", "dead")

#: Threads' rows kept before those of ended threads are folded into one (many short-lived threads dispatch).
_FOLD_AT = 64

# A job's row of run counts: the runs in each duration bucket (not cumulative), their durations' sum, and
# the runs of each outcome. A list of floats that one thread adds to in place: no object made per run.
_OUTCOMES = tuple(outcome.value for outcome in Outcome)
_OUTCOME_AT = {value: len(DURATION_BUCKETS) + 1 + index for index, value in enumerate(_OUTCOMES)}
_SUM_AT = len(DURATION_BUCKETS)
_RUN_ROW = len(DURATION_BUCKETS) + 1 + len(_OUTCOMES)


class Metrics:
    """The metrics of the queues given to :meth:`instrument`, on one registry.

    Each thread counts into rows of its own, without a lock: a lock shared by
    every worker and dispatcher, which each ``prometheus_client`` metric
    takes per update, forms convoys under the GIL that cost a third of the
    in-memory throughput. A scrape adds the rows up.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY, *, depth_every: float = DEPTH_EVERY) -> None:
        self.registry = registry
        self._dispatched: dict[str, _Rows] = {}
        self._runs: dict[str, _Rows] = {}
        #: Every queue instrumented (two may share a name: two in memory, a database queue and its twin).
        self._queues: list[StoreQueue] = []
        self.depth = QueueDepth(depth_every)
        registry.register(_Counted(self._dispatched, self._runs, self._queues))
        registry.register(self.depth)

    def instrument(self, queue: StoreQueue) -> None:
        """Count ``queue``'s dispatches and runs from now on, and read its depth at each scrape; once per queue."""
        if any(each is queue for each in self._queues):
            return
        label = queue.queue_label
        queue.observe_dispatches(_DispatchCounter(self._dispatched.setdefault(label, _Rows(1))).observe)
        queue.observe_runs(_RunCounter(self._runs.setdefault(label, _Rows(_RUN_ROW))).observe)
        self._queues.append(queue)
        self.depth.add(queue)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread (an ``OSError`` if the port is taken)."""
        start_http_server(port, host, registry=self.registry)


class _Rows:
    """Rows of counts by job name, ``width`` numbers each: a dict per thread that only that thread writes.

    A scrape adds up copies; the rows of threads that ended are folded into
    one, so that many short-lived threads (a web server's) cost nothing.
    """

    def __init__(self, width: int) -> None:
        self.width = width
        #: ``local.rows``: this thread's rows, once :meth:`mine` has made them.
        self.local = threading.local()
        self._lock = threading.Lock()
        self._live: list[tuple[threading.Thread, dict[str, list[float]]]] = []
        self._ended: dict[str, list[float]] = {}

    def mine(self) -> dict[str, list[float]]:
        """This thread's rows."""
        try:
            rows: dict[str, list[float]] = self.local.rows
        except AttributeError:
            rows = self.local.rows = {}
            with self._lock:
                self._live.append((threading.current_thread(), rows))
                if len(self._live) > _FOLD_AT:
                    self._fold()
        return rows

    def total(self) -> dict[str, list[float]]:
        """Every thread's rows added up."""
        total: dict[str, list[float]] = {}
        with self._lock:
            self._fold()
            self._add(total, self._ended)
            for _, rows in self._live:
                self._add(total, rows)
        return total

    def _fold(self) -> None:
        # An ended thread writes no more: its rows can move to the ended ones. Under the lock.
        ended = [entry for entry in self._live if not entry[0].is_alive()]
        for entry in ended:
            self._add(self._ended, entry[1])
            self._live.remove(entry)

    def _add(self, into: dict[str, list[float]], rows: dict[str, list[float]]) -> None:
        for name, row in rows.copy().items():
            mine = into.setdefault(name, [0.0] * self.width)
            for index, amount in enumerate(list(row)):
                mine[index] += amount


class _DispatchCounter:
    """The dispatch observer of one queue: each job enqueued, by NAME, in the thread's rows."""

    def __init__(self, rows: _Rows) -> None:
        self._local = rows.local
        self._mine = rows.mine

    def observe(self, name: str) -> None:
        try:
            rows: dict[str, list[float]] = self._local.rows  # inline: this runs at every dispatch
        except AttributeError:
            rows = self._mine()
        row = rows.get(name)
        if row is None:
            row = rows[name] = [0.0]
        row[0] += 1


class _RunCounter:
    """The run observer of one queue: each run's outcome and duration, by NAME, in the thread's rows."""

    def __init__(self, rows: _Rows) -> None:
        self._local = rows.local
        self._mine = rows.mine

    def observe(self, report: RunReport) -> None:
        try:
            rows: dict[str, list[float]] = self._local.rows  # inline: this runs after every run
        except AttributeError:
            rows = self._mine()
        row = rows.get(report.name)
        if row is None:
            row = rows[report.name] = [0.0] * _RUN_ROW
        duration = report.duration
        row[bisect_left(DURATION_BUCKETS, duration)] += 1
        row[_SUM_AT] += duration
        row[_OUTCOME_AT[report.outcome._value_]] += 1  # _value_: Enum's .value is a slower property


class _Counted(Collector):
    """The counters, the histogram and the in-progress gauge, added up from the rows when scraped."""

    def __init__(self, dispatched: dict[str, _Rows], runs: dict[str, _Rows], queues: list[StoreQueue]) -> None:
        self._dispatched = dispatched
        self._runs = runs
        self._queues = queues

    def describe(self) -> Iterable[Metric]:
        return list(self._families({}, {}, {}))

    def collect(self) -> Iterable[Metric]:
        dispatched = {label: rows.total() for label, rows in list(self._dispatched.items())}
        runs = {label: rows.total() for label, rows in list(self._runs.items())}
        running: dict[str, int] = {}
        for queue in list(self._queues):
            running[queue.queue_label] = running.get(queue.queue_label, 0) + queue.running_here()
        return list(self._families(dispatched, runs, running))

    @staticmethod
    def _families(
        dispatched: dict[str, dict[str, list[float]]],
        runs: dict[str, dict[str, list[float]]],
        running: dict[str, int],
    ) -> Iterator[Metric]:
        counted = CounterMetricFamily(
            "syncjobs_dispatched",
            "Jobs this process enqueued (not those refused, nor a unique job's duplicates)",
            labels=["queue", "job_name"],
        )
        for queue, rows in sorted(dispatched.items()):
            for name, row in sorted(rows.items()):
                counted.add_metric([queue, name], row[0])
        yield counted
        ended = CounterMetricFamily(
            "syncjobs_runs",
            "Runs ended in this process, by outcome (done, retry, dead, cancelled, aborted, deferred)",
            labels=["queue", "job_name", "outcome"],
        )
        durations = HistogramMetricFamily(
            "syncjobs_run_duration_seconds", "How long runs took in this process", labels=["queue", "job_name"]
        )
        for queue, rows in sorted(runs.items()):
            for name, row in sorted(rows.items()):
                for outcome in _OUTCOMES:
                    if row[_OUTCOME_AT[outcome]]:
                        ended.add_metric([queue, name, outcome], row[_OUTCOME_AT[outcome]])
                cumulative = itertools.accumulate(row[:_SUM_AT])
                buckets = [(_bound(bound), count) for bound, count in zip(DURATION_BUCKETS, cumulative, strict=True)]
                durations.add_metric([queue, name], buckets, row[_SUM_AT])
        yield ended
        yield durations
        in_progress = GaugeMetricFamily(
            "syncjobs_runs_in_progress", "Runs going on in this process now", labels=["queue"]
        )
        for queue, count in sorted(running.items()):
            in_progress.add_metric([queue], count)
        yield in_progress


class QueueDepth(Collector):
    """``syncjobs_jobs{queue,state}`` and ``syncjobs_oldest_ready_age_seconds{queue}``, read when scraped.

    A reading serves this process's scrapes for ``every`` seconds, so that
    several scrapers cost one count (a query per queue, on a database). A
    queue that cannot be counted (its database is down) is left out of that
    scrape, and logged.
    """

    def __init__(self, every: float = DEPTH_EVERY) -> None:
        self._every = every
        # One queue per source of jobs: a database queue's twin of the same name counts the same rows.
        self._queues: dict[Hashable, StoreQueue] = {}
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._reading: list[QueueCounts] = []

    def add(self, queue: StoreQueue) -> None:
        with self._lock:
            self._queues.setdefault(queue.jobs_source, queue)
            self._read_at = -math.inf

    def describe(self) -> Iterable[Metric]:
        return list(self._families([]))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.read()))

    def read(self) -> list[QueueCounts]:
        """Each queue's counts, at most ``every`` seconds old."""
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self._every:
                self._reading = _by_name(_count(self._queues.values()))
                self._read_at = now
            return self._reading

    @staticmethod
    def _families(readings: list[QueueCounts]) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "syncjobs_jobs",
            "Jobs by state now: queued (ready), running, parked (a delay or a retry's backoff), dead",
            labels=["queue", "state"],
        )
        age = GaugeMetricFamily(
            "syncjobs_oldest_ready_age_seconds",
            "How long the longest-waiting ready job has waited (since due; in memory, since dispatched)",
            labels=["queue"],
        )
        for counts in readings:
            for state in _STATES:
                jobs.add_metric([counts.queue, state], getattr(counts, state))
            age.add_metric([counts.queue], counts.oldest_queued_age or 0.0)
        yield jobs
        yield age


def _bound(bound: float) -> str:
    """A bucket's ``le`` label, as Prometheus writes it."""
    return "+Inf" if bound == math.inf else repr(bound)


def _by_name(readings: Iterable[QueueCounts]) -> list[QueueCounts]:
    """One reading per queue name: those of queues of one name with jobs of their own (in memory) added up."""
    named: dict[str, QueueCounts] = {}
    for reading in readings:
        before = named.get(reading.queue)
        if before is not None:
            ages = [age for age in (before.oldest_queued_age, reading.oldest_queued_age) if age is not None]
            reading = dataclasses.replace(  # noqa: PLW2901 - the sum takes the reading's place
                reading,
                queued=before.queued + reading.queued,
                running=before.running + reading.running,
                parked=before.parked + reading.parked,
                dead=before.dead + reading.dead,
                oldest_queued_age=max(ages) if ages else None,
            )
        named[reading.queue] = reading
    return list(named.values())


def _count(queues: Iterable[StoreQueue]) -> Iterator[QueueCounts]:
    for queue in queues:
        try:
            yield queue.counts()
        except Exception:
            logger.warning("cannot count the jobs of queue %r for its metrics", queue.queue_label, exc_info=True)
