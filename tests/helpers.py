"""Jobs and tools the tests share.

A job is rebuilt from JSON for every run, so it cannot carry an Event; it
carries the id of a :class:`Probe` instead, which the test holds.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import syncjobs

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="no-request")

PROBES: dict[str, Probe] = {}

#: Generous bound for anything a test waits on; pytest-timeout is the backstop.
WAIT = 10.0


class Probe:
    """Scripts what a ProbeJob does on each attempt and records every run.

    Actions: ``ok``, ``retryable``, ``fatal``, ``crash`` (ValueError),
    ``block`` (wait for :attr:`release`, ignoring cancellation), ``cooperate``
    (wait for release or cancellation, raising ``Cancelled`` on the latter),
    ``cancel`` (raise ``Cancelled`` at once), ``set_context``.
    The last action repeats for later attempts.
    """

    def __init__(self, *actions: str, wait: float | None = 0.0) -> None:
        self.id = uuid.uuid4().hex
        self.actions = list(actions) or ["ok"]
        self.wait = wait  # retry_wait override; None means the default backoff
        self.runs: list[dict[str, Any]] = []
        self.finished: list[dict[str, Any]] = []
        self.release = threading.Event()
        self.cond = threading.Condition()
        PROBES[self.id] = self

    def action(self, attempt: int) -> str:
        return self.actions[min(attempt, len(self.actions) - 1)]

    def wait_runs(self, count: int, timeout: float = WAIT) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.runs) >= count, timeout):
                raise AssertionError(f"expected {count} run(s), saw {len(self.runs)}")

    def wait_finished(self, count: int, timeout: float = WAIT) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.finished) >= count, timeout):
                raise AssertionError(f"expected {count} finished run(s), saw {len(self.finished)}")

    @property
    def attempts(self) -> list[int]:
        return [run["attempt"] for run in self.runs]


@dataclasses.dataclass
class ProbeJob(syncjobs.Job):
    NAME = "tests.probe"
    probe: str
    label: int = 0

    def run(self) -> None:
        probe = PROBES[self.probe]
        info = syncjobs.current_job()
        assert info is not None
        record = {
            "attempt": info.attempt,
            "id": info.id,
            "name": info.name,
            "max_attempts": info.max_attempts,
            "label": self.label,
            "request_id": request_id.get(),
            "info": info,
            "at": time.monotonic(),
        }
        with probe.cond:
            probe.runs.append(record)
            probe.cond.notify_all()
        try:
            self._act(probe.action(info.attempt), probe, info)
        finally:
            with probe.cond:
                probe.finished.append(record)
                probe.cond.notify_all()

    def _act(self, action: str, probe: Probe, info: syncjobs.RunInfo) -> None:
        if action == "ok":
            return
        if action == "retryable":
            raise syncjobs.Retryable("try again")
        if action == "fatal":
            raise syncjobs.Fatal("nope")
        if action == "crash":
            raise ValueError("boom")
        if action == "block":
            assert probe.release.wait(WAIT), "the test never released a blocked job"
            return
        if action == "cooperate":
            while not probe.release.is_set():
                if info.cancelled.wait(0.01):
                    raise syncjobs.Cancelled()
            return
        if action == "cancel":
            raise syncjobs.Cancelled()
        if action == "set_context":
            request_id.set("set-by-job")
            return
        raise AssertionError(f"unknown action {action!r}")

    def retry_wait(self, failed_attempt: int) -> float:
        wait = PROBES[self.probe].wait
        return super().retry_wait(failed_attempt) if wait is None else wait


class OnceJob(ProbeJob):
    """Allows one run in all: any failure dead-letters it."""

    NAME = "tests.once"
    MAX_ATTEMPTS = 1


class ThreeTimesJob(ProbeJob):
    NAME = "tests.three_times"
    MAX_ATTEMPTS = 3


class FakeClock:
    """A monotonic clock that moves only when told, waking whoever listens."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.listeners: list[Callable[[], object]] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for listener in self.listeners:
            listener()


def wait_until(condition: Callable[[], bool], timeout: float = WAIT, what: str = "condition") -> None:
    """Poll ``condition`` until it holds or ``timeout`` passes (then fail)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)  # the poll interval of a deadline-bounded wait, not a synchronisation


def popen_interruptible(args: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    """``subprocess.Popen``, with SIGINT at its default in the child: Ctrl-C (SIGINT) interrupts it.

    A test run launched in the background of a non-interactive shell has
    SIGINT ignored, and a child inherits that across exec, so a test that
    presses Ctrl-C on it would press in vain. A handler does not survive
    exec: set for the moment of the spawn, the child starts with SIGINT at
    its default. Only this call changes: the test run's own SIGINT stays as
    it was. From the main thread, as every signal handler is set.
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return subprocess.Popen(args, **kwargs)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def refuse_label_13(job: syncjobs.Job) -> Iterator[None]:
    """A dispatch hook (``queue.around_dispatch``) that refuses a ProbeJob labelled 13, as a bad payload is."""
    if isinstance(job, ProbeJob) and job.label == 13:
        raise syncjobs.QueueError("label 13 is refused")
    yield
