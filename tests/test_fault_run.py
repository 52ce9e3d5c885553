"""The fault run: worker processes keep every promise while the network path to the server fails.

Runnable alone: ``python -m pytest tests/test_fault_run.py`` (add ``-k postgresql`` or ``-k mysql``).

Four worker processes (``tests.dbworker``, two worker threads each, lease
5 s) reach the server through the suite's fault proxy; their ledger writes
straight to the server, so a fault never touches the test's bookkeeping.
5,000 jobs are dispatched, then the schedule runs, each fault under load:

1. the path black-holes for 10 s (nothing flows, nothing is reset);
2. every connection is cut and new ones are refused for 2 s (the server is down);
3. a second 10 s black hole;
4. a second cut and 2 s refusal.

Before each fault, and after it, the run waits (polled, with a deadline)
until every worker process has started jobs since: a process that does not
recover on its own fails the run; none is ever restarted.

What is asserted:

- nothing is lost: every job has a finished run in the ledger, the queue's
  ``pending_count()`` is 0 at the end and there is no dead letter;
- every duplicate run is attributed to a fault. A job may run more than once
  only because a fault cut an in-flight outcome: its completion could not be
  written, or its lease ran out while the path was down (a 10 s black hole is
  longer than the 5 s lease, so leases expire in it, and a 2 s refusal plus
  the reconnection can outlast what is left of one). So every run of a job
  but its last must have been in flight during a fault: the span from
  ``SLACK`` before its start (a claim waits a moment in the local buffer) to
  ``SLACK`` after its end (the completion is written in the next batch) must
  overlap a fault window. A repeat of a run that was nowhere near a fault is
  a duplicate the library made on its own;
- during each fault a ``dispatch()`` from the test process, through the proxy,
  raises ``DatabaseUnavailable`` within ``dispatch_timeout`` + 1 s;
- every worker process recovered without restart: the same pids are alive at
  the end, and each started jobs after every fault, the last one included;
- during each black hole a queue of the test process, whose workers run the
  same jobs through the proxy, is shut down with ``shutdown(grace=2)``, which
  returns within 4 s: what it could not write is left to the lease, and the
  other workers run it (so "nothing lost" covers it too).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import syncjobs
from tests.dbworker import Ledger, LedgerJob, Run, Workers, use_ledger
from tests.faultproxy import Call, FaultProxy

JOBS = 5000
PROCESSES = 4
LEASE = 5.0
BLACK_HOLE = 10.0
DOWN = 2.0
DISPATCH_TIMEOUT = 2.0
SHUTDOWN_GRACE = 2.0
#: Each job's work: 5,000 of them last about the whole schedule on 2 cores.
JOB_SECONDS = 0.03
#: Runs started before each fault, and after it before the next, at least.
RUNS_BETWEEN_FAULTS = 400
#: How long after a fault every worker process may take to run jobs again.
RECOVERY = 30.0
#: How long the jobs left after the last fault may take (about 10 s on 2 cores).
DRAIN = 60.0
#: Claim-to-start and end-to-completion-write margin of the duplicate rule.
SLACK = 1.0
#: The fault tests' own table: what a fault leaves behind stays out of the other tests' way.
TABLE = "syncjobs_fault_jobs"
#: Job numbers of the dispatches tried during faults (not among the 5,000).
PROBE_BASE = 1_000_000


@dataclasses.dataclass
class Fault:
    kind: str
    began: float  # time.time(), as the ledger's
    ended: float = 0.0

    def __str__(self) -> str:
        return f"{self.kind} [{self.began:.2f}, {self.ended:.2f}]"


class FaultRun:
    def __init__(self, server_url: str, proxy: FaultProxy, ledger: Ledger) -> None:
        self.server_url = server_url
        self.proxy = proxy
        self.ledger = ledger
        self.name = f"fault-{uuid.uuid4().hex[:12]}"
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self.probes: dict[int, Call] = {}
        # Straight to the server: dispatches the jobs and checks the outcome.
        self.direct = self._queue(server_url, workers=0)
        self.direct.install_schema()
        # Through the proxy: the dispatches tried during the faults.
        self.probe = self._queue(proxy.url(server_url), workers=0, dispatch_timeout=DISPATCH_TIMEOUT)
        self.probe.install_schema()
        self.workers = Workers(
            proxy.url(server_url), self.name, table=TABLE, workers=2, lease=LEASE, ledger_url=server_url
        )
        self.pids: set[int] = set()
        self.local_queues: list[syncjobs.DatabaseJobQueue] = []
        self._pause = threading.Event()  # never set: waiting on it is a fault's duration

    def _queue(self, url: str, **options: object) -> syncjobs.DatabaseJobQueue:
        queue = syncjobs.DatabaseJobQueue(
            url,
            queue=self.name,
            table=TABLE,
            lease=LEASE,
            poll_interval=0.2,
            **options,  # type: ignore[arg-type]
        )
        queue.register(LedgerJob)
        return queue

    # -- the schedule -----------------------------------------------------------

    def start(self) -> None:
        for _ in range(PROCESSES):
            self.pids.add(self.workers.spawn().pid)
        for start in range(0, JOBS, 500):
            self.direct.dispatch_many([LedgerJob(self.name, n, JOB_SECONDS) for n in range(start, start + 500)])

    def await_progress(self, since: float, what: str) -> None:
        """Until every worker process started a job at or after ``since``, and enough ran; else a problem."""
        deadline = time.monotonic() + RECOVERY
        while True:
            started = self.ledger.started_since(self.name, since)
            idle = self.pids - set(started)
            if not idle and sum(started.values()) >= RUNS_BETWEEN_FAULTS:
                return
            if time.monotonic() > deadline:
                self.problems.append(
                    f"{what}: within {RECOVERY:.0f} s, worker pid(s) {sorted(idle)} started no job "
                    f"({sum(started.values())} runs started in all)"
                )
                return
            self._pause.wait(0.1)  # the poll interval of a deadline-bounded wait

    def _wait_until(self, moment: float) -> None:
        """The fault lasts until ``moment`` (a monotonic time)."""
        self._pause.wait(max(0.0, moment - time.monotonic()))

    def _try_dispatch(self) -> Call:
        n = PROBE_BASE + len(self.probes)
        call = Call(lambda: self.probe.dispatch(LedgerJob(self.name, n)))
        self.probes[n] = call
        return call

    def _check_dispatch(self, fault: Fault, call: Call) -> None:
        limit = DISPATCH_TIMEOUT + 1.0
        if not call.done or not isinstance(call.error, syncjobs.DatabaseUnavailable) or call.seconds > limit:
            self.problems.append(
                f"during the {fault}: a dispatch should raise DatabaseUnavailable within {limit:.0f} s: {call!r}"
            )

    def black_hole(self) -> None:
        # A queue of this process runs jobs too, so that its shutdown has work in flight.
        local = self._queue(self.proxy.url(self.server_url), workers=2)
        self.local_queues.append(local)
        local_began = time.time()
        local.start()
        self.await_local_run(local_began)
        fault = Fault("black hole", time.time())
        began = time.monotonic()
        self.faults.append(fault)
        self.proxy.blackhole()
        try:
            self._wait_until(began + 0.5)  # in-flight statements are stuck by now
            dispatch = self._try_dispatch()
            self._wait_until(began + 1.0)
            shutdown = Call(lambda: local.shutdown(grace=SHUTDOWN_GRACE))
            self._wait_until(began + BLACK_HOLE)
        finally:
            self.proxy.resume()
            fault.ended = time.time()
        self._check_dispatch(fault, dispatch)
        limit = SHUTDOWN_GRACE * 2
        if not shutdown.done or shutdown.error is not None or shutdown.seconds > limit:
            self.problems.append(
                f"during the {fault}: shutdown(grace={SHUTDOWN_GRACE:.0f}) should return within {limit:.0f} s: "
                f"{shutdown!r}"
            )
        if not shutdown.wait(RECOVERY):  # it must not hang past the fault either
            self.problems.append(f"after the {fault}: the test process's shutdown() still hangs: {shutdown!r}")

    def await_local_run(self, since: float) -> None:
        deadline = time.monotonic() + RECOVERY
        while os.getpid() not in self.ledger.started_since(self.name, since):
            if time.monotonic() > deadline:
                self.problems.append("the test process's own queue ran no job before the black hole")
                return
            self._pause.wait(0.05)  # the poll interval of a deadline-bounded wait

    def down(self) -> None:
        fault = Fault("cut and refusal", time.time())
        began = time.monotonic()
        self.faults.append(fault)
        self.proxy.refuse()  # every connection reset; new ones reset on arrival
        try:
            dispatch = self._try_dispatch()
            dispatch.wait(DISPATCH_TIMEOUT + 1.0)
            self._wait_until(began + DOWN)
        finally:
            self.proxy.resume()
            fault.ended = time.time()
        self._check_dispatch(fault, dispatch)

    def run(self) -> None:
        began = time.time()
        self.start()
        self.await_progress(began, "before the first fault")
        for fault in (self.black_hole, self.down, self.black_hole, self.down):
            fault()
            self.await_progress(self.faults[-1].ended, f"after the {self.faults[-1]}")
        if not self.direct.join(DRAIN):
            self.problems.append(
                f"{self.direct.pending_count()} job(s) still pending {DRAIN:.0f} s after the last fault's recovery"
            )
        alive = {proc.pid for proc in self.workers.procs if proc.poll() is None}
        if alive != self.pids:
            self.problems.append(f"worker process(es) {sorted(self.pids - alive)} died")

    # -- the verdict ------------------------------------------------------------

    def exposed(self, run: Run) -> bool:
        """Whether ``run`` was in flight during a fault (see the module's docstring)."""
        start = run.started - SLACK
        end = (run.ended if run.ended is not None else float("inf")) + SLACK
        return any(start <= fault.ended and fault.began <= end for fault in self.faults)

    def verdict(self) -> list[str]:
        problems = list(self.problems)
        by_job: dict[int, list[Run]] = {}
        for run in self.ledger.details(self.name):
            by_job.setdefault(run.n, []).append(run)
        for runs in by_job.values():
            runs.sort(key=lambda run: run.started)
        lost = [n for n in range(JOBS) if not any(run.ended is not None for run in by_job.get(n, []))]
        if lost:
            problems.append(f"{len(lost)} job(s) lost (no finished run): {lost[:20]}")
        pending = self.direct.pending_count()
        if pending:
            problems.append(f"pending_count() is {pending} at the end")
        dead = self.direct.dead_letters()
        if dead:
            problems.append(f"{len(dead)} dead letter(s): {[(d.job_id, d.error) for d in dead[:5]]}")
        unexplained = {
            n: runs for n, runs in by_job.items() if n < JOBS and not all(self.exposed(run) for run in runs[:-1])
        }
        if unexplained:
            sample = {
                n: [(r.pid, round(r.started, 2), r.ended and round(r.ended, 2)) for r in runs]
                for n, runs in list(unexplained.items())[:5]
            }
            problems.append(
                f"{len(unexplained)} job(s) ran again although no run of theirs was near a fault "
                f"(faults: {', '.join(map(str, self.faults))}): {sample}"
            )
        for n, call in self.probes.items():
            if call.done and call.error is None and n not in by_job:
                problems.append(f"the dispatch of job {n} returned normally, yet it never ran")
        return problems

    def summary(self) -> str:
        runs = self.ledger.details(self.name)
        repeated = len(runs) - len({run.n for run in runs})
        late = sorted(n for n in self.probes if any(run.n == n for run in runs))
        return (
            f"queue {self.name!r}: {len(runs)} runs, {repeated} repeated; "
            f"dispatches tried during faults that ran anyway: {late}; "
            f"proxy accepted {self.proxy.accepted} connections"
        )

    def stop(self) -> list[str]:
        """Stop the worker processes; close this process's queues (their connections too), bounded."""
        logs = self.workers.stop()
        for queue in (*self.local_queues, self.probe, self.direct):
            Call(lambda queue=queue: queue.shutdown(grace=0)).wait(RECOVERY)  # type: ignore[misc]
        return logs


@pytest.fixture
def fault_run(server_url: str, proxy: FaultProxy) -> Iterator[FaultRun]:
    ledger = Ledger(server_url)
    ledger.create()
    use_ledger(ledger)  # for the test process's own queue
    run = FaultRun(server_url, proxy, ledger)
    try:
        yield run
    finally:
        proxy.resume()
        run.stop()
        use_ledger(None)
        ledger.close()


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_every_promise_holds_through_black_holes_and_cuts(fault_run: FaultRun) -> None:
    fault_run.run()
    problems = fault_run.verdict()
    assert problems == [], "\n".join([fault_run.summary(), *problems])


def test_the_ledger_rides_out_a_cut_connection(server_url: str, proxy: FaultProxy) -> None:
    """A fault in the tests' own bookkeeping must not pass for one of the library's."""
    ledger = Ledger(proxy.url(server_url))
    try:
        ledger.create()
        queue = f"ledger-{uuid.uuid4().hex[:12]}"
        run = ledger.start(queue, 0, 0)
        assert proxy.cut() >= 1
        ledger.finish(queue, run)
        proxy.cut()
        ledger.record(queue, 1, 0)
        assert [(r.n, r.ended is not None) for r in ledger.details(queue)] == [(0, True), (1, True)]
    finally:
        ledger.close()
