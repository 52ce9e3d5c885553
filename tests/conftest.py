from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import syncjobs
from tests.helpers import PROBES, FakeClock, OnceJob, ProbeJob, ThreeTimesJob

QueueFactory = Callable[..., syncjobs.InMemoryJobQueue]


class Backend:
    """Builds queues of one backend for the contract suite, and cleans them up."""

    name = "memory"
    supports_fake_clock = True

    def __init__(self) -> None:
        self.queues: list[syncjobs.InMemoryJobQueue] = []

    def make(self, workers: int = 2, *, clock: FakeClock | None = None, **options: Any) -> syncjobs.InMemoryJobQueue:
        if clock is not None:
            options["clock"] = clock
        queue = syncjobs.InMemoryJobQueue(workers, **options)
        if clock is not None:
            # The timer thread sleeps on real time: after a jump of the fake
            # clock, wait until it has handed over whatever became due.
            clock.listeners.append(queue._memory.timers.settle)
        for job_cls in (ProbeJob, OnceJob, ThreeTimesJob):
            queue.register(job_cls)
        self.queues.append(queue)
        return queue

    def close(self) -> None:
        for probe in PROBES.values():
            probe.release.set()
        for queue in self.queues:
            queue.shutdown(grace=0)


@pytest.fixture(params=["memory"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    backend = Backend()
    yield backend
    backend.close()


@pytest.fixture
def make_queue(backend: Backend) -> QueueFactory:
    return backend.make


@pytest.fixture(autouse=True)
def _forget_probes() -> Iterator[None]:
    yield
    for probe in PROBES.values():
        probe.release.set()
    PROBES.clear()


@pytest.fixture(autouse=True)
def _no_worker_crash(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A worker loop that crashes is a bug, whatever the test asserted."""
    caplog.set_level(logging.DEBUG, logger="syncjobs")
    yield
    crashes = [r for r in caplog.records if r.name.startswith("syncjobs") and r.levelno >= logging.CRITICAL]
    assert not crashes, f"syncjobs logged CRITICAL: {[r.getMessage() for r in crashes]}"
