"""A worker admits a claimed run without a lock: ``shutdown(grace=0)`` at each step of it.

The worker publishes the run, reads whether shutdown has begun, then
decides that the run begins; shutdown sets its flag, then takes every
published run. These tests stop a worker before each of those steps (with a
trace function, the one way to hold a thread between two lines) and shut
the queue down there: a run that began has its one attempt spent, and one
that did not waits in the queue with its attempt unspent, whatever the step.
"""

from __future__ import annotations

import inspect
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import syncjobs
from syncjobs.worker import RunLimit, WorkerPool
from tests.helpers import WAIT, OnceJob, Probe

_ADMIT = WorkerPool._admit.__code__

TraceFunction = Callable[[types.FrameType, str, Any], Any]


def _line_of(text: str) -> int:
    """The number of the line of ``WorkerPool._admit`` that holds ``text`` (once)."""
    lines, first = inspect.getsourcelines(WorkerPool._admit)
    found = [first + index for index, line in enumerate(lines) if line.split("#")[0].strip() == text]
    assert len(found) == 1, f"WorkerPool._admit has {len(found)} lines {text!r}: update this test"
    return found[0]


class PauseAt:
    """Holds the first worker thread that reaches a line of ``_admit``, until ``resume()``."""

    def __init__(self, line: int) -> None:
        self.line = line
        self.paused = threading.Event()
        self.resumed = threading.Event()

    def trace(self, frame: types.FrameType, event: str, arg: Any) -> TraceFunction | None:
        return self._in_admit if frame.f_code is _ADMIT else None

    def _in_admit(self, frame: types.FrameType, event: str, arg: Any) -> TraceFunction | None:
        if event == "line" and frame.f_lineno == self.line and not self.paused.is_set():
            self.paused.set()
            assert self.resumed.wait(WAIT), "the test never resumed the worker"
        return self._in_admit

    def resume(self) -> None:
        self.resumed.set()


@pytest.fixture
def probe() -> Iterator[Probe]:
    probe = Probe("ok")
    yield probe
    probe.release.set()


def _queue_paused_at(
    line: int, probe: Probe, *, workers: int = 1, limit: int | None = None
) -> tuple[syncjobs.InMemoryJobQueue, PauseAt, list[syncjobs.DeadLetter]]:
    """A started queue whose first worker has claimed ``probe``'s job and stands before ``line``."""
    queue = syncjobs.InMemoryJobQueue(workers)
    queue.register(OnceJob)
    if limit is not None:
        queue.limit_runs(RunLimit(limit, queue.stop_claiming))  # as ``syncjobs worker --max-jobs`` does
    dead: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(dead.append)
    pause = PauseAt(line)
    threading.settrace(pause.trace)  # for the threads start() makes
    try:
        queue.start()
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
    queue.dispatch(OnceJob(probe.id))
    assert pause.paused.wait(WAIT), "the worker never reached the line"
    return queue, pause, dead


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "line",
    [
        "self._running[run] = None",  # not yet published: shutdown finds nothing to take
        "if not stopping.is_set():",  # published: shutdown takes it before the worker reads the flag
        "left = None if limit is None else limit.take()",  # the flag read unset: shutdown takes it and decides first
    ],
)
def test_a_run_shutdown_stops_before_it_begins_waits_in_the_queue_unspent(line: str, probe: Probe) -> None:
    queue, pause, dead = _queue_paused_at(_line_of(line), probe)
    [worker] = queue.worker_threads()
    queue.shutdown(grace=0)
    pause.resume()
    worker.join(WAIT)
    assert not worker.is_alive()
    assert probe.runs == []
    assert dead == []
    assert queue.pending_count() == 1
    with queue:  # the next start runs it, as its first and only attempt
        assert queue.join(WAIT)
    assert probe.attempts == [0]
    assert dead == []


@pytest.mark.timeout(30)
def test_a_run_that_began_when_shutdown_stops_it_has_its_attempt_spent(probe: Probe) -> None:
    queue, pause, dead = _queue_paused_at(_line_of("return True"), probe)
    queue.shutdown(grace=0)
    # Handed back on its last attempt: a dead letter, while the worker goes on to run it.
    assert [(letter.attempts, letter.error) for letter in dead] == [
        (1, "aborted at shutdown on its last attempt (1 of 1)")
    ]
    pause.resume()
    probe.wait_finished(1)
    assert queue.pending_count() == 0


@pytest.mark.timeout(30)
def test_a_run_the_limit_allowed_begins_though_the_last_one_stopped_claiming_meanwhile(probe: Probe) -> None:
    """With ``--max-jobs 2``, every run the limit allows begins, or the worker would wait for it forever."""
    queue, pause, dead = _queue_paused_at(
        _line_of("if (limit is None or left is not None) and run.decide(_WORKER):"), probe, workers=2, limit=2
    )
    # The first worker took 1 of the 2 runs and stands before beginning it;
    # the second takes the last, and the limit stops the queue claiming.
    second = Probe("ok")
    queue.dispatch(OnceJob(second.id))
    second.wait_finished(1)
    assert probe.runs == []
    pause.resume()
    probe.wait_finished(1)
    assert queue.pending_count() == 0
    assert dead == []
    queue.shutdown()
