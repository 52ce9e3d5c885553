"""Wake-ups between processes on one host: a datagram to each worker waiting on a queue.

SQLite and MySQL have no NOTIFY. Every process that shares a SQLite file runs
on one host, and so do the web app and its workers on many a MySQL setup.
Each store with workers binds a Unix datagram socket in a directory of its own
queue (under the temporary directory, private to the user); a dispatch sends
one empty datagram to every socket there. The datagram carries nothing: the
woken worker claims from the table as it would after a poll, which stays as
the fallback (workers on other hosts, a socket that could not be made, a
platform without Unix datagram sockets).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger("syncjobs.database")

#: At least the step in which a file system stamps mtimes: a second on some
#: (ext4 with small inodes, HFS+), two on FAT.
_MTIME_TICK_NS = 2_000_000_000
#: Linux stamps file times from its coarse real-time clock, which lags
#: ``time.time_ns()`` by a tick or more (the time module does not name
#: CLOCK_REALTIME_COARSE; it is 5 on Linux).
_COARSE_REALTIME = 5 if sys.platform.startswith("linux") else None


def stamp_clock_ns() -> int:
    """Now by the clock that stamps file times (Linux), or by the wall clock."""
    if _COARSE_REALTIME is not None:
        return time.clock_gettime_ns(_COARSE_REALTIME)
    return time.time_ns()


def wake_directory(database: str, table: str, queue: str) -> Path | None:
    """Where the sockets of this queue's waiting workers are; None where the platform has no such sockets.

    ``database`` names the database the same way in every process: a SQLite
    file's real path, a server's host, port and database name.
    """
    if not hasattr(socket, "AF_UNIX") or not hasattr(os, "getuid"):
        return None
    try:
        temporary = tempfile.gettempdir()
    except OSError:  # no usable temporary directory (a read-only container): workers poll
        return None
    # Short: a socket's path must fit in 104 bytes (macOS, whose temporary directory is long).
    digest = hashlib.sha256(f"{database}\0{table}\0{queue}".encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return Path(temporary) / f"syncjobs-{os.getuid()}" / digest


def _private_directory(directory: Path) -> bool:
    """Create ``directory`` (and its parent) for this user only; False if it is someone else's."""
    for path in (directory.parent, directory):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            logger.warning("%s is not a private directory of this user: no wake-ups, workers poll", path)
            return False
    return True


class Waker:
    """Sends the wake-ups: one datagram to each waiting worker's socket of a queue."""

    def __init__(self, directory: Path | None) -> None:
        self._directory = directory
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        # The sockets as last listed, with the directory's mtime then: a
        # dispatch stats the directory (one call) and lists it again only
        # when a worker came or went.
        self._listing: tuple[int, list[str]] | None = None

    def wake(self) -> None:
        """Best effort: the dispatch is committed, and a worker not woken finds the job at its poll."""
        directory = self._directory
        if directory is None:
            return
        try:
            paths = self._sockets(directory)
            sock = self._socket()
        except OSError:  # no worker ever waited here; or no socket to send from (out of descriptors, a sandbox)
            return
        for path in paths:
            try:
                sock.sendto(b"", path)
            except (ConnectionRefusedError, FileNotFoundError):
                # Its process died without removing it.
                with contextlib.suppress(OSError):
                    os.unlink(path)
            except OSError as exc:
                # EAGAIN: its buffer is full of wake-ups it has not read yet; it is awake.
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    logger.debug("could not wake %s", path, exc_info=True)

    def _sockets(self, directory: Path) -> list[str]:
        """The sockets in ``directory``; listed again only if its mtime moved, or may not have yet."""
        # Read before the stat: if the stamp is a whole step older than this,
        # a socket bound from now on moves it.
        now = stamp_clock_ns()
        mtime = os.stat(directory).st_mtime_ns
        listing = self._listing
        if listing is not None and listing[0] == mtime:
            return listing[1]
        paths = [entry.path for entry in os.scandir(directory) if entry.name.endswith(".sock")]
        # A file system stamps mtimes in coarse steps: a socket bound within the
        # step of the last change leaves the mtime as listed. A listing is kept
        # only once that step has passed; until then it is made again each time.
        # Where stamps have digits below the millisecond, Linux's come from the
        # clock read above: a socket bound from now on is stamped at least that.
        fine = _COARSE_REALTIME is not None and mtime % 1_000_000 != 0
        if now - mtime > (1_000_000 if fine else _MTIME_TICK_NS):
            self._listing = (mtime, paths)
        else:
            self._listing = None
        return paths

    def _socket(self) -> socket.socket:
        sock = self._sock
        if sock is None:
            with self._lock:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sock.setblocking(False)
                sock = self._sock
        return sock

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


#: Datagrams a listener reads at once after it rests; more only mean it is awake.
_DRAIN_AT_MOST = 256


class WakeListener:
    """A worker store's socket: datagrams that arrive call ``kick()`` (a loop in its own thread).

    After each kick it rests ``pause`` seconds, then takes every datagram
    that came meanwhile with one kick: a stream of dispatches wakes it a few
    hundred times a second, not once a job (the fetcher would not claim
    sooner anyway, see ``CLAIM_COALESCE``).
    """

    def __init__(self, directory: Path | None, kick: Callable[[], None], pause: float = 0.0) -> None:
        self._directory = directory
        self._kick = kick
        self._pause = pause
        self._sock: socket.socket | None = None
        self.path: Path | None = None
        self._pid = os.getpid()

    def bind(self) -> bool:
        """Make the socket (before the loop runs); False if there is none to make (then workers poll)."""
        directory = self._directory
        if directory is None:
            return False
        path = directory / f"{os.getpid()}-{uuid.uuid4().hex[:6]}.sock"
        for tries_left in reversed(range(3)):
            try:
                if not _private_directory(directory):
                    return False
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                try:
                    sock.bind(str(path))
                except BaseException:
                    sock.close()
                    raise
            except OSError as exc:
                if isinstance(exc, FileNotFoundError) and tries_left:
                    continue  # the last listener of another process removed the directory meanwhile
                logger.warning("could not make a wake-up socket in %s: workers poll", directory, exc_info=True)
                return False
            self._sock, self.path, self._pid = sock, path, os.getpid()
            return True
        return False

    def stop(self) -> None:
        """Wake the loop, so that it sees its stop event, even if its socket's file was removed under it."""
        sock = self._sock
        if sock is not None and os.getpid() == self._pid:  # a forked child would shut its parent's down
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # recv() returns at once (Linux)
        if self.path is not None:  # where shutdown() does not wake a reader
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
                sender.setblocking(False)
                sender.sendto(b"", str(self.path))

    def loop(self, stopping: threading.Event) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            while not stopping.is_set():
                try:
                    sock.recv(16)
                    # Those that came while it rested: one kick for all. Bounded,
                    # as a socket shut down by stop() reads as empty datagrams.
                    for _ in range(_DRAIN_AT_MOST):
                        if stopping.is_set():
                            break
                        sock.recv(16, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    pass
                except OSError:
                    if stopping.is_set():
                        return
                    logger.debug("the wake-up socket failed; workers poll", exc_info=True)
                    return
                if not stopping.is_set():
                    self._kick()
                    stopping.wait(self._pause)
        finally:
            self.close()

    def close(self) -> None:
        """Close and remove the socket (idempotent)."""
        sock, path = self._sock, self.path
        self._sock = self.path = None
        if sock is not None:
            sock.close()
        if path is not None and os.getpid() == self._pid:  # a forked child's copy is its parent's socket
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):  # the last one out (another's socket keeps it)
                path.parent.rmdir()
