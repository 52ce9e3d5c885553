"""Throughput and latency of the in-memory queue, as ratios to baselines in the same run.

    python benchmarks/bench_memory.py [--jobs 20000] [--repeat 3]

Every figure is measured in this one process, one after the other, so that
the ratios hold on a noisy machine where the absolute numbers do not.  Each
baseline does only the bare minimum of any such queue per job: a
``json.dumps`` of the payload at submit, a ``json.loads`` of it inside the
submitter's ``copy_context()`` in a worker thread.

- (a) ``ThreadPoolExecutor(4).submit``;
- (b) 4 plain threads looping on one ``queue.Queue``: the floor of the design;
- (c) the same on a ``queue.SimpleQueue`` (the C queue syncjobs' workers wait
  on): shown beside (b) because (b) scatters and (c) does not. ``queue.Queue``
  is Python code around a lock: a thread the 5 ms switch interval preempts
  while it holds that lock stalls every other thread that reaches for it,
  and how often that happens decides (b)'s rate from run to run.

The same no-op runs as a job class and as a function task (``@queue.task``),
and as a job class with Prometheus metrics (the prometheus extra).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextvars
import dataclasses
import gc
import json
import queue
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable

import syncjobs

WORKERS = 4
#: What (b) and (c) loop on: a job's carried context and its JSON, or None to stop.
Work = queue.Queue[tuple[contextvars.Context, str] | None] | queue.SimpleQueue[tuple[contextvars.Context, str] | None]
PAYLOAD = {"user_id": 12345, "template": "welcome", "locale": "en"}


class Countdown:
    """Sets ``done`` when ``count`` jobs have reported."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.lock = threading.Lock()
        self.done = threading.Event()

    def tick(self) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.done.set()


@dataclasses.dataclass
class Noop(syncjobs.Job):
    NAME = "bench.noop"
    user_id: int
    template: str
    locale: str

    def run(self) -> None:
        pass


def run_syncjobs(jobs: int, *, metrics: bool = False) -> float:
    queue_ = syncjobs.InMemoryJobQueue(WORKERS)
    queue_.register(Noop)
    if metrics:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415 - the prometheus extra, asked for

        from syncjobs.metrics import Metrics  # noqa: PLC0415

        Metrics(CollectorRegistry()).instrument(queue_)
    job = Noop(**PAYLOAD)  # type: ignore[arg-type]
    with queue_:
        began = time.perf_counter()
        for _ in range(jobs):
            queue_.dispatch(job)
        assert queue_.join(300)
        took = time.perf_counter() - began
    return jobs / took


def run_syncjobs_metrics(jobs: int) -> float:
    """The same, with Prometheus metrics (``syncjobs.metrics``): counters, histogram and gauge at every job."""
    return run_syncjobs(jobs, metrics=True)


def noop_task(user_id: int, template: str, locale: str) -> None:
    pass


def run_syncjobs_task(jobs: int) -> float:
    """The same no-op as a function task (``@queue.task``), dispatched with keyword arguments."""
    queue_ = syncjobs.InMemoryJobQueue(WORKERS)
    task = queue_.task(name="bench.noop_task")(noop_task)
    with queue_:
        began = time.perf_counter()
        for _ in range(jobs):
            task.dispatch(**PAYLOAD)  # type: ignore[arg-type]
        assert queue_.join(300)
        took = time.perf_counter() - began
    return jobs / took


def _bare_job(ctx: contextvars.Context, text: str, countdown: Countdown) -> None:
    ctx.run(json.loads, text)
    countdown.tick()


def run_executor(jobs: int) -> float:
    countdown = Countdown(jobs)
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as executor:
        began = time.perf_counter()
        for _ in range(jobs):
            executor.submit(_bare_job, contextvars.copy_context(), json.dumps(PAYLOAD), countdown)
        assert countdown.done.wait(300)
        took = time.perf_counter() - began
    return jobs / took


def run_plain_threads(jobs: int, make_queue: Callable[[], Work] = queue.Queue) -> float:
    countdown = Countdown(jobs)
    work = make_queue()

    def loop() -> None:
        while (item := work.get()) is not None:
            _bare_job(item[0], item[1], countdown)

    threads = [threading.Thread(target=loop) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    for _ in range(jobs):
        work.put((contextvars.copy_context(), json.dumps(PAYLOAD)))
    assert countdown.done.wait(300)
    took = time.perf_counter() - began
    for _ in threads:
        work.put(None)
    for thread in threads:
        thread.join()
    return jobs / took


def run_simple_queue_threads(jobs: int) -> float:
    """(b) on a ``queue.SimpleQueue``."""
    return run_plain_threads(jobs, queue.SimpleQueue)


def dispatch_cost_us(calls: int) -> float:
    """Median wall time of one dispatch() call, on a queue whose workers do not compete."""
    queue_ = syncjobs.InMemoryJobQueue(workers=0)
    queue_.register(Noop)
    job = Noop(**PAYLOAD)  # type: ignore[arg-type]
    samples = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        began = clock()
        queue_.dispatch(job)
        samples.append(clock() - began)
    return statistics.median(samples) / 1000


def bytes_per_pending_job(jobs: int) -> tuple[float, float]:
    """Memory held per job queued and not yet run: syncjobs, and (b)'s tuple on a ``queue.Queue``."""

    def ours() -> object:
        queue_ = syncjobs.InMemoryJobQueue(workers=0)
        queue_.register(Noop)
        job = Noop(**PAYLOAD)  # type: ignore[arg-type]
        for _ in range(jobs):
            queue_.dispatch(job)
        return queue_

    def plain() -> object:
        work: queue.Queue[tuple[contextvars.Context, str]] = queue.Queue()
        for _ in range(jobs):
            work.put((contextvars.copy_context(), json.dumps(PAYLOAD)))
        return work

    def measure(fill: Callable[[], object]) -> float:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = fill()
            gc.collect()
            used = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        del kept
        return used / jobs

    return measure(ours), measure(plain)


def pickup_latency_ms(jobs: int = 200, rate: float = 100.0) -> tuple[float, float]:
    """p50 and p99 from dispatch() to the start of run(), at ``rate`` jobs a second."""
    latencies: list[float] = []
    lock = threading.Lock()

    @dataclasses.dataclass
    class Stamp(syncjobs.Job):
        NAME = "bench.stamp"
        sent: float

        def run(self) -> None:
            with lock:
                latencies.append(time.perf_counter() - self.sent)

    queue_ = syncjobs.InMemoryJobQueue(WORKERS)
    queue_.register(Stamp)
    with queue_:
        began = time.perf_counter()
        for i in range(jobs):
            # Paced dispatch: the benchmark's own clock, not a synchronisation.
            pause = began + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            queue_.dispatch(Stamp(time.perf_counter()))
        assert queue_.join(60)
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def metrics_cost(jobs: int, pairs: int) -> tuple[float, float]:
    """The rate with metrics, and its ratio to the rate without: the median of ``pairs`` runs side by side.

    The two runs of a pair follow each other, so that their ratio shares the
    machine's spell, and take turns at going first, so that neither always
    meets the heap and caches the other left; the median of the pairs'
    ratios is what is stated.
    """
    rates, ratios = [], []
    for pair in range(pairs):
        if pair % 2:
            rates.append(run_syncjobs_metrics(jobs))
            without = run_syncjobs(jobs)
        else:
            without = run_syncjobs(jobs)
            rates.append(run_syncjobs_metrics(jobs))
        ratios.append(rates[-1] / without)
    return statistics.median(rates), statistics.median(ratios)


def all_rates(runs: list[Callable[[int], float]], jobs: int, repeat: int) -> list[list[float]]:
    """Each run's rates; the runs take turns, so a slow spell of the machine hits all of them."""
    rates: list[list[float]] = [[] for _ in runs]
    for _ in range(repeat):
        for index, run in enumerate(runs):
            rates[index].append(run(jobs))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    rates = all_rates(
        [run_syncjobs, run_syncjobs_task, run_executor, run_plain_threads, run_simple_queue_threads],
        args.jobs,
        args.repeat,
    )
    ours, tasks, executor, plain, simple = (statistics.median(r) for r in rates)
    # Five times the jobs per run: a cost of a few percent is smaller than the scatter of short runs.
    measured, cost = metrics_cost(5 * args.jobs, 4 * args.repeat - 1)
    dispatch = dispatch_cost_us(args.jobs)
    p50, p99 = pickup_latency_ms()
    pending, pending_plain = bytes_per_pending_job(50_000)

    print(f"{args.jobs} no-op jobs, {WORKERS} workers, median of {args.repeat} runs")
    print(f"  syncjobs InMemoryJobQueue      {ours:>9,.0f} jobs/s")
    print(
        f"  (a) ThreadPoolExecutor.submit  {executor:>9,.0f} jobs/s   syncjobs is {ours / executor:.2f}x (goal >= 1.0x)"
    )
    print(f"  (b) 4 threads on a queue.Queue {plain:>9,.0f} jobs/s   syncjobs is {ours / plain:.2f}x (goal >= 0.6x)")
    print(
        f"      its runs from {min(rates[3]):,.0f} to {max(rates[3]):,.0f}; syncjobs' from "
        f"{min(rates[0]):,.0f} to {max(rates[0]):,.0f}"
    )
    print(f"  (c) the same on a SimpleQueue   {simple:>9,.0f} jobs/s   syncjobs is {ours / simple:.2f}x (no goal)")
    print(f"  the same as a function task    {tasks:>9,.0f} jobs/s   {tasks / plain:.2f}x (b) (goal >= 0.6x)")
    print(f"  with Prometheus metrics        {measured:>9,.0f} jobs/s   {cost:.2f}x without (goal >= 0.9x)")
    print(f"  dispatch() median              {dispatch:>9.2f} us       (goal < 10 us)")
    print(f"  pickup latency, 200 jobs at 100/s: p50 {p50:.3f} ms, p99 {p99:.3f} ms (goal p50 < 0.3 ms)")
    print(
        f"  memory per pending job         {pending:>9.0f} B        (b)'s tuple on a queue.Queue: "
        f"{pending_plain:.0f} B (goal <= 300 B)"
    )


if __name__ == "__main__":
    main()
