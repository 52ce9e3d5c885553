"""A dispatch wakes the worker processes on this host at once, long before their poll."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import syncjobs
from syncjobs.database import wakeup
from syncjobs.database.sqlite import database_file
from syncjobs.database.wakeup import wake_directory
from tests.conftest import TEST_TABLE
from tests.dbworker import Ledger, LedgerJob, Workers
from tests.helpers import WAIT, Probe, ProbeJob, wait_until
from tests.test_database import dispatcher, make
from tests.test_db_connections import _fork_child, _wait_children

#: Far longer than any test here may take: a job picked up came by a wake-up.
NEVER = 600.0


@pytest.mark.timeout(120)
def test_a_dispatch_wakes_a_worker_process_long_before_its_poll(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], ledger: Ledger
) -> None:
    # PostgreSQL by NOTIFY; SQLite and MySQL by a datagram to each worker process on this host.
    queue, name = dispatcher(db_url, queues)
    workers = Workers(db_url, name, workers=1, poll_interval=NEVER, log_level="DEBUG")
    try:
        worker = workers.spawn()

        def idle_waits() -> int:
            return workers.log(worker).count("looking again in")

        waits = 0
        for n in range(5):
            # Dispatched once the worker has gone back to waiting (since the
            # last dispatch): only a wake-up can bring this job to it.
            wait_until(lambda waits=waits: idle_waits() > waits, what="the worker to wait for work")
            waits = idle_waits()
            queue.dispatch(LedgerJob(name, n))
            wait_until(lambda n=n: len(ledger.runs(name)) == n + 1, timeout=30, what=f"job {n} to be picked up")
    finally:
        logs = workers.stop()
    assert sorted(n for n, _, _ in ledger.runs(name)) == list(range(5))
    assert [line for log in logs for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))] == []


def _sqlite_wake_directory(db_url: str, queue: str) -> Path:
    directory = wake_directory(os.path.realpath(database_file(db_url)), TEST_TABLE, queue)
    assert directory is not None
    return directory


def _sockets(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("*.sock")) if directory.exists() else []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_worker_removes_its_socket_and_its_thread_at_shutdown(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    queue = make(db_url, queues, workers=1, poll_interval=NEVER)
    directory = _sqlite_wake_directory(db_url, queue.queue_name)
    probe = Probe()
    queue.start()
    assert len(_sockets(directory)) == 1
    assert [t for t in threading.enumerate() if t.name == "syncjobs-wakeup"]
    # A second queue object, as another process would: its dispatch reaches the worker's socket.
    other = make(db_url, queues, workers=0, queue=queue.queue_name)
    other.dispatch(ProbeJob(probe.id))
    probe.wait_finished(1)
    queue.shutdown()
    assert _sockets(directory) == []
    assert not directory.exists(), "the last worker out leaves no directory behind"
    assert not [t for t in threading.enumerate() if t.name == "syncjobs-wakeup" and t.is_alive()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_socket_left_by_a_dead_process_is_removed_and_the_dispatch_goes_on(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue]
) -> None:
    queue = make(db_url, queues, workers=0)
    directory = _sqlite_wake_directory(db_url, queue.queue_name)
    directory.mkdir(mode=0o700, parents=True)
    stale = directory / "999999-deadbeef.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(stale))  # closed without unlinking: what a killed process leaves
    probe = Probe()
    queue.dispatch(ProbeJob(probe.id))
    assert not stale.exists()
    assert queue.pending_count() == 1
    directory.rmdir()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_wake_directory_others_can_write_to_is_not_used_and_workers_poll(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = make(db_url, queues, workers=1, poll_interval=0.2)
    directory = _sqlite_wake_directory(db_url, queue.queue_name)
    directory.mkdir(mode=0o700, parents=True)
    directory.chmod(0o777)  # anyone could put a socket here, or take one away
    try:
        probe = Probe()
        with caplog.at_level(logging.WARNING, logger="syncjobs"):
            queue.start()
        assert "is not a private directory" in caplog.text
        assert _sockets(directory) == []
        other = make(db_url, queues, workers=0, queue=queue.queue_name)
        other.dispatch(ProbeJob(probe.id))
        probe.wait_finished(1)  # by its poll
        assert queue.join(WAIT)
    finally:
        queue.shutdown()
        directory.rmdir()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_forked_childs_shutdown_leaves_its_parents_wake_up_socket(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], tmp_path: Path
) -> None:
    queue = make(db_url, queues, workers=1, poll_interval=NEVER)
    directory = _sqlite_wake_directory(db_url, queue.queue_name)
    probe = Probe()
    queue.start()
    sockets = _sockets(directory)
    assert len(sockets) == 1

    def child() -> None:
        # Its copy of the parent's queue (no SQLite call: forking a process
        # whose threads use SQLite leaves the child nothing safe to use).
        queue.shutdown(grace=0)

    (pid,) = [_fork_child(child, tmp_path / "child.err")]
    codes = _wait_children([pid], timeout=30.0)
    assert codes == {pid: 0}, (tmp_path / "child.err").read_text() if (tmp_path / "child.err").exists() else ""
    assert _sockets(directory) == sockets, "the child removed its parent's socket"
    other = make(db_url, queues, workers=0, queue=queue.queue_name)
    other.dispatch(ProbeJob(probe.id, 2))
    assert queue.join(WAIT), "the parent's worker no longer hears wake-ups"
    queue.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_worker_whose_socket_file_was_removed_still_stops_at_once(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], caplog: pytest.LogCaptureFixture
) -> None:
    # A /tmp cleaner, or rm -r of the directory: the stop datagram has nowhere to go.
    queue = make(db_url, queues, workers=1, poll_interval=NEVER)
    directory = _sqlite_wake_directory(db_url, queue.queue_name)
    queue.start()
    for name in _sockets(directory):
        (directory / name).unlink()
    with caplog.at_level(logging.WARNING, logger="syncjobs"):
        queue.shutdown()
    assert "did not answer" not in caplog.text
    assert not [t for t in threading.enumerate() if t.name == "syncjobs-wakeup" and t.is_alive()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_wake_up_that_cannot_be_sent_never_fails_the_committed_dispatch(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = make(db_url, queues, workers=1, poll_interval=0.2)
    listener.start()  # a socket in the directory: the dispatch has someone to wake
    queue = make(db_url, queues, workers=0, queue=listener.queue_name)

    def no_socket(*args: object, **kwargs: object) -> socket.socket:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(wakeup.socket, "socket", no_socket)
    probe = Probe()
    job_id = queue.dispatch(ProbeJob(probe.id))
    assert job_id
    monkeypatch.undo()
    probe.wait_finished(1)  # by the worker's poll


@pytest.mark.timeout(60)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_without_a_usable_temporary_directory_workers_poll(
    db_url: str, queues: list[syncjobs.DatabaseJobQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_directory() -> str:
        raise FileNotFoundError("No usable temporary directory found")

    monkeypatch.setattr(wakeup.tempfile, "gettempdir", no_directory)
    queue = make(db_url, queues, workers=1, poll_interval=0.2)
    probe = Probe()
    with queue:
        make(db_url, queues, workers=0, queue=queue.queue_name).dispatch(ProbeJob(probe.id))
        probe.wait_finished(1)
    assert not [t for t in threading.enumerate() if t.name == "syncjobs-wakeup" and t.is_alive()]


@contextlib.contextmanager
def resting_listener(tmp_path: Path, pause: float) -> Iterator[tuple[wakeup.Waker, list[int]]]:
    """A listener in its own thread that rests ``pause`` s after each kick; a waker; the kicks so far."""
    directory = tmp_path / "wake"
    directory.mkdir(mode=0o700)
    kicks: list[int] = []
    listener = wakeup.WakeListener(directory, lambda: kicks.append(1), pause=pause)
    assert listener.bind()
    stopping = threading.Event()
    thread = threading.Thread(target=listener.loop, args=(stopping,), name="test-wake-listener")
    thread.start()
    waker = wakeup.Waker(directory)
    try:
        yield waker, kicks
    finally:
        stopping.set()
        listener.stop()
        thread.join(WAIT)
        waker.close()
    assert not thread.is_alive()


@pytest.mark.timeout(60)
def test_wake_ups_that_come_while_the_listener_rests_make_one_kick(tmp_path: Path) -> None:
    # A stream of dispatches: one kick for all that came during the rest,
    # not a kick (and a claim) a job.
    with resting_listener(tmp_path, pause=0.3) as (waker, kicks):
        waker.wake()
        wait_until(lambda: len(kicks) == 1, what="the first kick")
        for _ in range(100):  # all within its rest of 0.3 s
            waker.wake()
        wait_until(lambda: len(kicks) >= 2, what="the kick for those that came during the rest")
    assert 2 <= len(kicks) <= 3, len(kicks)  # one a datagram would be 101


@pytest.mark.timeout(60)
def test_a_listener_resting_between_wake_ups_stops_at_once(tmp_path: Path) -> None:
    with resting_listener(tmp_path, pause=NEVER) as (waker, kicks):
        waker.wake()
        wait_until(lambda: len(kicks) == 1, what="the first kick")
        waker.wake()  # comes while it rests for NEVER seconds: no kick for it
    assert len(kicks) == 1


def _bound_socket(directory: Path, name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(directory / f"{name}.sock"))
    sock.settimeout(WAIT)
    return sock


def _drain(sock: socket.socket) -> int:
    """Read every datagram waiting on ``sock``; how many."""
    timeout, count = sock.gettimeout(), 0
    sock.setblocking(False)
    try:
        while True:
            try:
                sock.recv(16)
            except BlockingIOError:
                return count
            count += 1
    finally:
        sock.settimeout(timeout)


_FINE_STAMP = 1_700_000_000_123_456_789
_WHOLE_SECOND = 1_700_000_000_000_000_000
_linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="elsewhere fine stamps wait the 2 s step too"
)


@pytest.fixture
def wake_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "wake"
    directory.mkdir(mode=0o700)
    return directory


@pytest.mark.timeout(60)
def test_a_dispatch_lists_the_wake_directory_again_only_when_a_worker_came_or_went(
    wake_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listings = _count_listings(monkeypatch)
    first = _bound_socket(wake_dir, "first")
    os.utime(wake_dir, ns=(0, 1_000_000_000))  # its last change long past: the listing can be kept
    waker = wakeup.Waker(wake_dir)
    with first, contextlib.closing(waker):
        for _ in range(50):
            waker.wake()
        assert len(listings) == 1
        assert _drain(first) >= 1
        with _bound_socket(wake_dir, "second") as second:  # a worker comes: the directory's mtime moves
            waker.wake()
            assert len(listings) == 2
            assert second.recv(16) == b""
            assert _drain(first) == 1


@pytest.mark.timeout(60)
def test_a_worker_that_binds_within_the_mtime_tick_of_the_listing_is_woken(
    wake_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file system that stamps whole seconds: the second socket's bind
    # leaves the directory's mtime as it was when the first listing was
    # made, 1 ms after the change it stamped.
    first = _bound_socket(wake_dir, "first")
    stamp = _WHOLE_SECOND
    os.utime(wake_dir, ns=(stamp, stamp))
    monkeypatch.setattr(wakeup, "stamp_clock_ns", lambda: stamp + 1_000_000)
    waker = wakeup.Waker(wake_dir)
    with first, contextlib.closing(waker):
        waker.wake()
        assert first.recv(16) == b""
        with _bound_socket(wake_dir, "second") as second:
            os.utime(wake_dir, ns=(stamp, stamp))
            waker.wake()
            assert second.recv(16) == b""


def _count_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    listings: list[str] = []
    scandir = os.scandir

    def counted(path: Any) -> Any:
        listings.append(str(path))
        return scandir(path)

    monkeypatch.setattr(wakeup.os, "scandir", counted)
    return listings


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("stamp", "since", "listings_for_5"),
    [
        # Stamps with digits below the millisecond, from the clock read before the stat (Linux):
        # kept once that clock is past the stamp, by more than any finer step a file system has.
        pytest.param(_FINE_STAMP, 50_000_000, 1, marks=_linux_only),
        pytest.param(_FINE_STAMP, 2_000_000, 1, marks=_linux_only),
        pytest.param(_FINE_STAMP, 500_000, 5, marks=_linux_only),
        # Whole seconds (HFS+, ext4 with small inodes, FAT): 50 ms is within the step, listed each time.
        (_WHOLE_SECOND, 50_000_000, 5),
        (_WHOLE_SECOND, 2_100_000_000, 1),
    ],
)
def test_a_listing_is_kept_once_the_file_systems_mtime_step_has_passed(
    wake_dir: Path, monkeypatch: pytest.MonkeyPatch, stamp: int, since: int, listings_for_5: int
) -> None:
    listings = _count_listings(monkeypatch)
    with _bound_socket(wake_dir, "first") as first:
        os.utime(wake_dir, ns=(stamp, stamp))
        monkeypatch.setattr(wakeup, "stamp_clock_ns", lambda: stamp + since)
        waker = wakeup.Waker(wake_dir)
        with contextlib.closing(waker):
            for _ in range(5):
                waker.wake()
            assert len(listings) == listings_for_5
            assert _drain(first) == 5


@pytest.mark.timeout(60)
def test_a_socket_removed_after_the_listing_is_skipped_and_the_others_are_woken(wake_dir: Path) -> None:
    gone = _bound_socket(wake_dir, "a-gone")
    kept = _bound_socket(wake_dir, "b-kept")
    os.utime(wake_dir, ns=(0, 1_000_000_000))
    waker = wakeup.Waker(wake_dir)
    with kept, contextlib.closing(waker):
        waker.wake()
        assert gone.recv(16) == b""
        assert kept.recv(16) == b""
        gone.close()  # its process died: the file stays (the directory's mtime too), nobody reads it
        waker.wake()
        assert kept.recv(16) == b""
        assert not (wake_dir / "a-gone.sock").exists()
