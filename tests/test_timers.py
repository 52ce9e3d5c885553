"""The timer heap, by value (no waiting), and its thread with an injected clock."""

from __future__ import annotations

import threading
import time

import pytest

from syncjobs.timers import TimerHeap
from tests.helpers import WAIT, FakeClock


class Unorderable:
    """An item that refuses comparison: the heap must never compare items."""

    def __lt__(self, other: object) -> bool:
        raise AssertionError("items were compared")


def test_pop_due_returns_due_items_earliest_first() -> None:
    heap: TimerHeap[str] = TimerHeap(lambda item: None)
    heap.push(30.0, "c")
    heap.push(10.0, "a")
    heap.push(20.0, "b")
    assert heap.next_due() == 10.0
    assert heap.pop_due(9.99) == []
    assert heap.pop_due(20.0) == ["a", "b"]
    assert heap.entries() == [(30.0, "c")]
    assert len(heap) == 1


def test_equal_due_times_keep_insertion_order_without_comparing_items() -> None:
    heap: TimerHeap[Unorderable] = TimerHeap(lambda item: None)
    items = [Unorderable() for _ in range(5)]
    for item in items:
        heap.push(5.0, item)
    assert heap.pop_due(5.0) == items


def test_an_empty_heap_has_no_next_due() -> None:
    heap: TimerHeap[str] = TimerHeap(lambda item: None)
    assert heap.next_due() is None
    assert heap.pop_due(1e18) == []
    assert heap.entries() == []


def _collecting_heap(clock: FakeClock) -> tuple[TimerHeap[str], list[str], threading.Condition]:
    delivered: list[str] = []
    cond = threading.Condition()

    def on_due(item: str) -> None:
        with cond:
            delivered.append(item)
            cond.notify_all()

    heap = TimerHeap(on_due, clock=clock)
    clock.listeners.append(heap.settle)
    return heap, delivered, cond


def test_the_thread_hands_items_over_when_the_clock_reaches_them() -> None:
    clock = FakeClock(100.0)
    heap, delivered, cond = _collecting_heap(clock)
    heap.start()
    try:
        heap.push(105.0, "later")
        heap.push(101.0, "sooner")
        clock.advance(1.0)
        with cond:
            assert cond.wait_for(lambda: delivered == ["sooner"], WAIT)
        assert heap.entries() == [(105.0, "later")]
        clock.advance(4.0)
        with cond:
            assert cond.wait_for(lambda: delivered == ["sooner", "later"], WAIT)
    finally:
        heap.stop()


def test_an_earlier_entry_wakes_a_thread_sleeping_towards_a_later_one() -> None:
    # The real clock: the thread sleeps towards an entry an hour away, and
    # an entry due now must be handed over at once, not in an hour.
    delivered = threading.Event()
    heap: TimerHeap[str] = TimerHeap(lambda item: delivered.set() if item == "now" else None)
    heap.start()
    try:
        heap.push(time.monotonic() + 3600, "in an hour")
        heap.push(time.monotonic(), "now")
        assert delivered.wait(WAIT)
        assert [item for _, item in heap.entries()] == ["in an hour"]
    finally:
        heap.stop()


def test_stop_keeps_waiting_items_with_their_due_times() -> None:
    clock = FakeClock(0.0)
    heap, delivered, _ = _collecting_heap(clock)
    heap.start()
    heap.push(10.0, "parked")
    heap.stop()
    clock.advance(20.0)
    assert delivered == []
    assert heap.entries() == [(10.0, "parked")]


def test_a_restarted_heap_delivers_what_came_due_while_stopped() -> None:
    clock = FakeClock(0.0)
    heap, delivered, cond = _collecting_heap(clock)
    heap.push(10.0, "parked")
    clock.advance(20.0)
    assert delivered == []  # never started
    heap.start()
    try:
        with cond:
            assert cond.wait_for(lambda: delivered == ["parked"], WAIT)
    finally:
        heap.stop()


def test_start_twice_runs_one_thread() -> None:
    heap: TimerHeap[str] = TimerHeap(lambda item: None, name="syncjobs-timer-under-test")
    heap.start()
    heap.start()
    try:
        assert [t.name for t in threading.enumerate()].count("syncjobs-timer-under-test") == 1
    finally:
        heap.stop()
    assert "syncjobs-timer-under-test" not in [t.name for t in threading.enumerate()]


def test_an_item_whose_hand_over_raises_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(0.0)
    delivered: list[str] = []
    done = threading.Event()

    def on_due(item: str) -> None:
        if item == "bad":
            raise SystemExit("not even this stops the timer thread")
        delivered.append(item)
        done.set()

    heap = TimerHeap(on_due, clock=clock)
    clock.listeners.append(heap.settle)
    heap.start()
    try:
        heap.push(1.0, "bad")
        heap.push(2.0, "good")
        clock.advance(2.0)
        assert done.wait(WAIT)
        assert delivered == ["good"]
        assert any("handing over a due item failed" in r.getMessage() for r in caplog.records)
    finally:
        heap.stop()


def test_prune_drops_what_is_refused_and_keeps_the_order_of_the_rest() -> None:
    heap: TimerHeap[str] = TimerHeap(lambda item: None)
    for due, item in [(5.0, "e"), (1.0, "a"), (3.0, "c"), (2.0, "b"), (4.0, "d")]:
        assert heap.push(due, item) == len(heap)
    assert heap.prune(lambda item: item in {"b", "d", "e"}) == 3
    assert heap.entries() == [(2.0, "b"), (4.0, "d"), (5.0, "e")]
    assert heap.pop_due(4.5) == ["b", "d"]
