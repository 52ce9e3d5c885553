"""syncjobs.testing: an app's tests run what its code dispatched, with the production engine and a fake clock."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

import syncjobs
from syncjobs.testing import FakeClock, Outcome, TestQueue
from tests.helpers import WAIT

pytestmark = pytest.mark.timeout(60)

#: The app under test: a queue, a task and a class job, as an app module would have them.
app_queue = syncjobs.InMemoryJobQueue(workers=0)
SENT: list[str] = []
FAILS_LEFT: dict[str, int] = {}
GATE = threading.Event()


@app_queue.task(name="shop.send_receipt", max_attempts=3)
def send_receipt(order_id: int, email: str = "") -> str:
    left = FAILS_LEFT.get(email, 0)
    if left:
        FAILS_LEFT[email] = left - 1
        raise ConnectionError("smtp down")
    SENT.append(f"{order_id}:{email}")
    return f"sent {order_id}"


@app_queue.register
@dataclasses.dataclass
class Reindex(syncjobs.Job):
    NAME = "shop.reindex"
    MAX_ATTEMPTS = 1
    product: str

    def run(self) -> None:
        SENT.append(f"reindex {self.product}")
        send_receipt.dispatch(0, email=f"{self.product}@shop")  # a job that dispatches another


@app_queue.register
@dataclasses.dataclass
class Note(syncjobs.Job):
    NAME = "shop.note"
    text: str

    def run(self) -> None:
        SENT.append(self.text)


@app_queue.task(name="shop.forever")
def forever() -> None:
    """Dispatches itself again a minute later, for ever."""
    forever.using(delay=60).dispatch()


@app_queue.task(name="shop.blocks")
def blocks() -> None:
    GATE.wait(WAIT)


def checkout(order_id: int) -> syncjobs.JobHandle:
    """The app's own code: it dispatches as in production."""
    return send_receipt.dispatch(order_id, email="a@b.c")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    SENT.clear()
    FAILS_LEFT.clear()
    GATE.clear()


def test_what_the_app_dispatches_is_recorded_and_runs_only_when_asked() -> None:
    with TestQueue.diverting(app_queue) as jobs:
        handle = checkout(7)
        app_queue.dispatch(Reindex("lamp"), delay=30)
        assert jobs.dispatched_of(send_receipt) == [{"args": [], "kwargs": {"order_id": 7, "email": "a@b.c"}}]
        assert jobs.dispatched_of(Reindex) == [{"product": "lamp"}]
        assert [(d.name, d.delay) for d in jobs.dispatched] == [("shop.send_receipt", 0.0), ("shop.reindex", 30.0)]
        assert SENT == [], "nothing runs before run_all()"
        reports = jobs.run_all()
        assert [(r.name, r.outcome) for r in reports] == [
            ("shop.send_receipt", Outcome.DONE),
            ("shop.reindex", Outcome.DONE),
            ("shop.send_receipt", Outcome.DONE),
        ]
        assert SENT == ["7:a@b.c", "reindex lamp", "0:lamp@shop"]
        assert jobs.clock() == 30.0, "the delay passed on the fake clock"
        assert handle.result(0) == "sent 7"
        assert jobs.dispatched_of("shop.send_receipt")[1] == {
            "args": [],
            "kwargs": {"order_id": 0, "email": "lamp@shop"},
        }
    assert app_queue.pending_count() == 0, "the app's own queue got nothing"
    # After the block the app's queue takes its dispatches again.
    handle = checkout(8)
    assert app_queue.pending_count() == 1
    assert app_queue.cancel(handle)


def test_retries_run_at_once_on_the_fake_clock_by_the_usual_backoff() -> None:
    FAILS_LEFT["x@y"] = 2
    with TestQueue.diverting(app_queue) as jobs:
        handle = send_receipt.dispatch(1, email="x@y")
        reports = jobs.run_all()
        assert [(r.attempt, r.outcome, r.retry_in) for r in reports] == [
            (1, Outcome.RETRY, 1.0),
            (2, Outcome.RETRY, 2.0),
            (3, Outcome.DONE, None),
        ]
        assert reports[0].error == "job raised ConnectionError: smtp down"
        assert jobs.clock() == 3.0
        assert handle.result(0) == "sent 1"


def test_without_retries_a_failed_job_stays_parked_and_a_later_call_goes_on() -> None:
    FAILS_LEFT["x@y"] = 5
    with TestQueue.diverting(app_queue) as jobs:
        handle = send_receipt.dispatch(1, email="x@y")
        assert [r.outcome for r in jobs.run_all(retries=False)] == [Outcome.RETRY]
        status = handle.status()
        assert status is not None
        assert (status.state, status.attempts) == ("retrying", 1)
        assert [r.outcome for r in jobs.run_all()] == [Outcome.RETRY, Outcome.DEAD]
        with pytest.raises(syncjobs.JobFailed, match="smtp down"):
            handle.result(0)


def test_dispatch_checks_the_arguments_as_production_does_and_records_nothing_refused() -> None:
    with TestQueue.diverting(app_queue) as jobs:
        with pytest.raises(syncjobs.QueueError, match=r"shop\.send_receipt"):
            send_receipt.dispatch({1, 2})  # type: ignore[arg-type]
        with pytest.raises(syncjobs.QueueError, match="naive"):
            app_queue.dispatch(Reindex("x"), run_at=__import__("datetime").datetime(2030, 1, 1))
        assert jobs.dispatched == []
        assert jobs.run_all() == []


def test_a_job_that_does_not_end_makes_run_all_raise_rather_than_hang() -> None:
    try:
        with TestQueue.diverting(app_queue) as jobs:
            blocks.dispatch()
            with pytest.raises(TimeoutError, match=r"did not end within 0\.2s"):
                jobs.run_all(timeout=0.2)
            GATE.set()
            assert [r.outcome for r in jobs.run_all()] == [Outcome.DONE]
    finally:
        GATE.set()


def test_a_database_queue_is_diverted_too_dispatch_many_all_or_nothing(tmp_path: Path) -> None:
    queue = syncjobs.DatabaseJobQueue(f"sqlite:///{tmp_path / 'app.db'}", workers=0)
    queue.register(Note)
    try:
        with TestQueue.diverting(queue) as jobs:
            with pytest.raises(syncjobs.QueueError):
                queue.dispatch_many([Note("a"), Note(b"not json")])  # type: ignore[arg-type]
            assert jobs.dispatched == []
            handles = queue.dispatch_many([Note("a"), Note("b")])
            assert [r.outcome for r in jobs.run_all()] == [Outcome.DONE, Outcome.DONE]
            assert SENT == ["a", "b"]
            assert all(handle.status().state == "done" for handle in handles)  # type: ignore[union-attr]
        assert queue.pending_count() == 0, "nothing reached the database"
    finally:
        queue.shutdown(grace=0)


def test_diversions_nest_and_each_ends_with_its_block() -> None:
    with TestQueue.diverting(app_queue) as outer:
        with TestQueue.diverting(app_queue) as inner:
            checkout(1)
        checkout(2)
        assert [d.payload["kwargs"]["order_id"] for d in inner.dispatched] == [1]
        assert [d.payload["kwargs"]["order_id"] for d in outer.dispatched] == [2]
        outer.run_all()
    assert SENT == ["2:a@b.c"]


def test_run_all_ends_jobs_that_keep_dispatching_more_with_a_timeout() -> None:
    with TestQueue.diverting(app_queue) as jobs:
        forever.dispatch()
        with pytest.raises(TimeoutError):
            jobs.run_all(timeout=0.3)
        assert len(jobs.dispatched) > 2


def test_a_test_queue_of_its_own_with_a_clock_it_shares() -> None:
    clock = FakeClock(100.0)
    with TestQueue(clock=clock) as jobs:
        jobs.register(Note)
        later = jobs.dispatch(Note("z"), delay=60)
        jobs.start()
        clock.advance(59)
        assert jobs.status(later).state == "scheduled"  # type: ignore[union-attr]
        clock.advance(1)
        assert jobs.result(later, WAIT) is None
    assert SENT == ["z"]
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1)
