"""Many producers, many workers: every job runs exactly once and nothing is lost."""

from __future__ import annotations

import collections
import dataclasses
import threading

import pytest

import syncjobs
from tests.conftest import QueueFactory

PRODUCERS = 4
JOBS_EACH = 2_500


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_four_producers_ten_thousand_jobs_four_workers(make_queue: QueueFactory) -> None:
    runs: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()

    @dataclasses.dataclass
    class Count(syncjobs.Job):
        NAME = "tests.stress.count"
        n: int

        def run(self) -> None:
            with lock:
                runs[self.n] += 1

    queue = make_queue(workers=4)
    queue.register(Count)
    barrier = threading.Barrier(PRODUCERS)
    ids: list[list[str]] = [[] for _ in range(PRODUCERS)]

    def produce(index: int) -> None:
        barrier.wait()
        for i in range(JOBS_EACH):
            ids[index].append(queue.dispatch(Count(index * JOBS_EACH + i)))

    with queue:
        producers = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
        for producer in producers:
            producer.start()
        for producer in producers:
            producer.join(30)
        assert queue.join(30)
    total = PRODUCERS * JOBS_EACH
    assert len({job_id for chunk in ids for job_id in chunk}) == total
    assert sorted(runs) == list(range(total))
    assert set(runs.values()) == {1}
    assert queue.pending_count() == 0
