"""200 start/shutdown cycles of each backend leave nothing behind.

Threads, open file descriptors and server sessions are counted after a
warm-up cycle (drivers loaded, schema made) and again after the cycles. Each
cycle dispatches from the test thread and from a short-lived thread (as a
request thread of a web server would), so that connections really open.
One queue object is started and shut down ten times, then dropped for a
fresh one: both a restart and a dropped queue must give back what they took.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import syncjobs
from syncjobs.database.dialects import Connector
from tests.conftest import Backend
from tests.helpers import WAIT, Probe, ProbeJob

CYCLES = 200
RESTARTS_PER_QUEUE = 10
TABLE = "syncjobs_fault_jobs"
#: How long threads and connections that are ending may take to go.
SETTLE = 15.0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _own_socket_ports() -> set[int]:
    """The local TCP ports of this process's sockets (a server lists its clients by them)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as lines:
                next(lines)  # the header
                for line in lines:
                    fields = line.split()
                    if fields[9] in inodes:
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except FileNotFoundError:
            continue
    return ports


class ServerSessions:
    """The sessions the server lists for the test database that this process holds.

    Other processes (other test runs) use the same server and database, so a
    session counts when its client port is one of this process's sockets.
    The counting connection is left out.
    """

    def __init__(self, url: str) -> None:
        self.connector = Connector(url)

    def count(self) -> int:
        conn = self.connector.connect()
        try:
            cursor = conn.cursor()
            if self.connector.dialect.name == "postgresql":
                cursor.execute(
                    "SELECT client_port FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND client_port IS NOT NULL"
                )
                ports = [int(port) for (port,) in cursor.fetchall()]
            else:
                cursor.execute(
                    "SELECT HOST FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
                )
                ports = [int(host.rsplit(":", 1)[1]) for (host,) in cursor.fetchall() if ":" in host]
            cursor.close()
            own = _own_socket_ports()
            return sum(1 for port in ports if port in own)
        finally:
            conn.close()


def _build(backend: Backend) -> Any:
    if backend.url is None:
        queue: Any = syncjobs.InMemoryJobQueue(2)
    else:
        queue = syncjobs.DatabaseJobQueue(
            backend.url, workers=2, queue=f"leak-{uuid.uuid4().hex[:12]}", table=TABLE, poll_interval=0.2
        )
    queue.register(ProbeJob)
    return queue


def _cycle(queue: Any, probe: Probe, label: int) -> None:
    """Start, dispatch two jobs (one from a thread that then ends), wait for both, shut down."""
    queue.start()
    queue.dispatch(ProbeJob(probe.id, label))
    request = threading.Thread(target=queue.dispatch, args=(ProbeJob(probe.id, label + 1),), name="leak-request")
    request.start()
    request.join(WAIT)
    assert not request.is_alive(), "a dispatch from a short-lived thread hung"
    assert queue.join(WAIT), f"cycle {label // 2}: the two jobs did not run"
    queue.shutdown(grace=5)


class Usage:
    """What this process holds now: threads, file descriptors, server sessions."""

    def __init__(self, sessions: ServerSessions | None) -> None:
        self.threads = set(threading.enumerate())
        self.fds = open_fds()
        self.sessions = sessions.count() if sessions is not None else 0

    def excess_over(self, baseline: Usage) -> list[str]:
        excess = []
        extra_threads = self.threads - baseline.threads
        if extra_threads:
            excess.append(f"threads not in the baseline: {sorted(t.name for t in extra_threads)}")
        if self.fds > baseline.fds:
            excess.append(f"open file descriptors: {self.fds}, baseline {baseline.fds}")
        if self.sessions > baseline.sessions:
            excess.append(f"server sessions: {self.sessions}, baseline {baseline.sessions}")
        return excess


def _poll(condition: Callable[[], bool], timeout: float) -> bool:
    """``condition()`` once it holds, or as it stands when ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        threading.Event().wait(0.05)  # the poll interval of a deadline-bounded wait
    return True


def _no_queue_threads() -> bool:
    return not any(thread.name.startswith("syncjobs") for thread in threading.enumerate())


@pytest.mark.timeout(600)
def test_start_shutdown_cycles_leave_threads_fds_and_sessions_at_their_baseline(backend: Backend) -> None:
    sessions = ServerSessions(backend.url) if backend.url and not backend.url.startswith("sqlite") else None
    probe = Probe()
    queue = _build(backend)
    _cycle(queue, probe, 0)  # the warm-up: drivers loaded, schema made
    # Threads that end on their own (a listener, within its poll interval) go
    # before the baseline is taken; one that stays for good is part of it.
    _poll(_no_queue_threads, SETTLE)
    baseline = Usage(sessions)
    for cycle in range(1, CYCLES):
        if cycle % RESTARTS_PER_QUEUE == 0:
            queue = _build(backend)  # the last one is dropped: what it held must go with it
        _cycle(queue, probe, 2 * cycle)
    del queue
    _poll(lambda: not Usage(sessions).excess_over(baseline), SETTLE)
    excess = Usage(sessions).excess_over(baseline)
    assert excess == [], f"after {CYCLES} cycles on {backend.name}: {excess}"
    assert sorted(run["label"] for run in probe.runs) == list(range(2 * CYCLES))


#: Threads that dispatch once and end, as the request threads of a threaded web server.
REQUEST_THREADS = 60
#: What they may leave open while the queue runs: a small pool, not one connection each.
POOL_BOUND = 8


def test_short_lived_dispatching_threads_hold_no_connection_each(db_url: str) -> None:
    """Issue item 8: a thread that dispatched once and ended must not keep a connection (a session) open."""
    sessions = ServerSessions(db_url) if not db_url.startswith("sqlite") else None
    queue = syncjobs.DatabaseJobQueue(db_url, workers=2, queue=f"leak-{uuid.uuid4().hex[:12]}", table=TABLE)
    queue.register(ProbeJob)
    probe = Probe()
    try:
        queue.start()
        queue.dispatch(ProbeJob(probe.id, -1))
        assert queue.join(WAIT)
        baseline = Usage(sessions)
        for label in range(REQUEST_THREADS):
            request = threading.Thread(target=queue.dispatch, args=(ProbeJob(probe.id, label),))
            request.start()
            request.join(WAIT)
            assert not request.is_alive(), "a dispatch from a short-lived thread hung"
        assert queue.join(WAIT)
        usage = Usage(sessions)
        held = f"{REQUEST_THREADS} ended threads left {usage.fds - baseline.fds} more descriptors open and "
        held += f"{usage.sessions - baseline.sessions} more server sessions"
        assert usage.fds - baseline.fds <= POOL_BOUND, held
        assert usage.sessions - baseline.sessions <= POOL_BOUND, held
    finally:
        queue.shutdown(grace=5)
    assert sorted(run["label"] for run in probe.runs) == list(range(-1, REQUEST_THREADS))
