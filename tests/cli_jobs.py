"""Jobs for the ``syncjobs`` command's tests, imported by the worker process with ``--import``.

Each prints a line to stdout when it starts, so that a test can wait for a
job to be running (never a fixed sleep).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading

import syncjobs

#: Not a queue: what `--app tests.cli_jobs:ANSWER` is refused for.
ANSWER = 42


def _started(what: str) -> syncjobs.RunInfo:
    info = syncjobs.current_job()
    assert info is not None
    sys.stdout.write(f"started {what} {info.id} attempt {info.attempt} pid {os.getpid()}\n")
    sys.stdout.flush()
    return info


@dataclasses.dataclass
class Quick(syncjobs.Job):
    NAME = "cli.quick"
    n: int

    def run(self) -> None:
        if self.n < 0:
            raise syncjobs.Fatal(f"negative n {self.n}")


@dataclasses.dataclass
class Sleepy(syncjobs.Job):
    """Runs ``seconds`` unless cancelled, as a well-behaved long job does."""

    NAME = "cli.sleepy"
    seconds: float

    def run(self) -> None:
        info = _started("sleepy")
        if info.cancelled.wait(self.seconds):
            raise syncjobs.Cancelled()


@dataclasses.dataclass
class Stubborn(syncjobs.Job):
    """Ignores its cancel token, as a job blocked in a C call would."""

    NAME = "cli.stubborn"
    seconds: float

    def run(self) -> None:
        _started("stubborn")
        threading.Event().wait(self.seconds)


#: What made the function task below. A worker's ``--import`` finds a task by
#: its module, whichever queue made it; the tests dispatch its calls from a
#: queue of their own, as a web process with its own queue object would.
_tasks = syncjobs.InMemoryJobQueue(workers=0)


@_tasks.task(name="cli.shout", max_attempts=1)
def shout(text: str, *, times: int = 1) -> str:
    if not text:
        raise ValueError("nothing to shout")
    sys.stdout.write(f"shout {text * times} pid {os.getpid()}\n")
    sys.stdout.flush()
    return text * times
