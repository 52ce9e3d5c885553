"""The JobQueue contract (../shared/API.md), written once against the backend fixture."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import gc
import logging
import math
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import ClassVar

import pytest

import syncjobs
import syncjobs.worker
from tests.conftest import Backend, QueueFactory
from tests.helpers import WAIT, FakeClock, OnceJob, Probe, ProbeJob, ThreeTimesJob, request_id, wait_until

# Shutdown returns within its grace plus this fixed margin, whatever jobs do.
SHUTDOWN_MARGIN = 1.0


def dead_letters(queue: syncjobs.JobQueue) -> list[syncjobs.DeadLetter]:
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)
    return letters


def wait_late_finish_dropped(caplog: pytest.LogCaptureFixture, job_id: str) -> None:
    """Wait until the worker has applied (that is, dropped) an abandoned run's late outcome."""
    wait_until(
        lambda: any(
            "late finish of abandoned job" in r.getMessage() and getattr(r, "job_id", None) == job_id
            for r in caplog.records
        ),
        what="the abandoned run's late outcome to be dropped",
    )


def shutdown_in_thread(queue: syncjobs.JobQueue, grace: float) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []

    def stop() -> None:
        began = time.monotonic()
        queue.shutdown(grace=grace)
        took.append(time.monotonic() - began)

    thread = threading.Thread(target=stop, name="test-shutdown")
    thread.start()
    return thread, took


# -- dispatch and running ------------------------------------------------


def test_a_dispatched_job_runs_once_with_its_payload_and_id(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe("ok")
    with queue:
        job_id = queue.dispatch(ProbeJob(probe.id, label=42))
        assert queue.join(WAIT)
    assert [(r["label"], r["id"], r["name"], r["attempt"]) for r in probe.runs] == [(42, job_id, "tests.probe", 0)]
    assert queue.pending_count() == 0


def test_job_ids_are_unique_strings(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=0)
    probe = Probe()
    ids = {queue.dispatch(ProbeJob(probe.id)) for _ in range(100)}
    assert len(ids) == 100
    assert all(isinstance(i, str) and i for i in ids)


def test_jobs_dispatched_before_start_run_after_it(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe()
    for label in range(5):
        queue.dispatch(ProbeJob(probe.id, label))
    assert queue.pending_count() == 5
    with queue:
        assert queue.join(WAIT)
    assert sorted(r["label"] for r in probe.runs) == [0, 1, 2, 3, 4]


def test_workers_zero_queues_without_running(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=0)
    probe = Probe()
    with queue:
        queue.dispatch(ProbeJob(probe.id))
        assert queue.join(timeout=0.05) is False
    assert probe.runs == []
    assert queue.pending_count() == 1


def test_a_plain_class_job_round_trips_through_vars(make_queue: QueueFactory) -> None:
    seen: list[tuple[str, list[int]]] = []

    class Plain(syncjobs.Job):
        NAME = "tests.plain"

        def __init__(self, who: str, numbers: list[int]) -> None:
            self.who = who
            self.numbers = numbers

        def run(self) -> None:
            seen.append((self.who, self.numbers))

    queue = make_queue()
    queue.register(Plain)
    with queue:
        queue.dispatch(Plain("ada", [1, 2]))
        assert queue.join(WAIT)
    assert seen == [("ada", [1, 2])]


def test_each_run_rebuilds_the_job_from_its_payload(make_queue: QueueFactory) -> None:
    runs: list[list[str]] = []

    @dataclasses.dataclass
    class Mutating(syncjobs.Job):
        NAME = "tests.mutating"
        items: list[str]

        def run(self) -> None:
            self.items.append("changed")
            runs.append(list(self.items))
            if len(runs) == 1:
                raise syncjobs.Retryable("again")

        def retry_wait(self, failed_attempt: int) -> float:
            return 0.0

    queue = make_queue()
    queue.register(Mutating)
    job = Mutating(["a"])
    queue.dispatch(job)
    job.items.append("after dispatch")
    with queue:
        assert queue.join(WAIT)
    assert runs == [["a", "changed"], ["a", "changed"]]


# -- registration --------------------------------------------------------


def test_register_is_a_class_decorator_and_idempotent(make_queue: QueueFactory) -> None:
    queue = make_queue()

    @queue.register
    @dataclasses.dataclass
    class Decorated(syncjobs.Job):
        NAME = "tests.decorated"

        def run(self) -> None:
            pass

    assert queue.register(Decorated) is Decorated
    assert queue.register(ProbeJob) is ProbeJob  # registered by the fixture already


def test_a_second_class_with_a_taken_name_is_refused(make_queue: QueueFactory) -> None:
    queue = make_queue()

    class Impostor(syncjobs.Job):
        NAME = "tests.probe"

    with pytest.raises(syncjobs.QueueError, match=r"'tests.probe'.*Impostor.*already taken.*ProbeJob"):
        queue.register(Impostor)


def test_a_class_without_a_name_is_refused_at_register(make_queue: QueueFactory) -> None:
    class Nameless(syncjobs.Job):
        def run(self) -> None:
            pass

    with pytest.raises(TypeError, match="Nameless needs a NAME"):
        make_queue().register(Nameless)


@pytest.mark.parametrize("bad_name", ["", "   ", None, 7])
def test_an_empty_or_non_string_name_is_refused_at_definition(bad_name: object) -> None:
    with pytest.raises(TypeError, match="needs a NAME"):

        class Bad(syncjobs.Job):
            NAME = bad_name  # type: ignore[assignment]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "5"])
def test_max_attempts_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(TypeError, match="MAX_ATTEMPTS must be an int >= 1"):

        class Bad(syncjobs.Job):
            NAME = "tests.bad_attempts"
            MAX_ATTEMPTS = bad  # type: ignore[assignment]


def test_register_refuses_what_is_not_a_job_class(make_queue: QueueFactory) -> None:
    with pytest.raises(TypeError, match=r"subclass of syncjobs\.Job"):
        make_queue().register(dict)  # type: ignore[type-var]


# -- bad input at dispatch ----------------------------------------------


def test_dispatch_of_an_unregistered_class_names_it(make_queue: QueueFactory) -> None:
    @dataclasses.dataclass
    class Unregistered(syncjobs.Job):
        NAME = "tests.unregistered"

    queue = make_queue()
    with pytest.raises(syncjobs.QueueError, match=r"'tests.unregistered'.*not registered.*register\(Unregistered\)"):
        queue.dispatch(Unregistered())
    assert queue.pending_count() == 0


def test_dispatch_of_something_that_is_not_a_job(make_queue: QueueFactory) -> None:
    with pytest.raises(syncjobs.QueueError, match=r"takes a syncjobs\.Job instance, got str"):
        make_queue().dispatch("send_email")  # type: ignore[arg-type]


@dataclasses.dataclass
class AnyPayload(syncjobs.Job):
    NAME = "tests.any_payload"
    value: object = None


def _cycle() -> list[object]:
    items: list[object] = [1]
    items.append(items)
    return items


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1, 2}, r"field 'value' is a set, which is not JSON-serializable"),
        (math.nan, r"field 'value' is nan, which JSON cannot represent"),
        ({"n": math.inf}, r"field 'value.n' is inf"),
        ({1: "one"}, r"field 'value' has the key 1 of type int; JSON keys are strings"),
        (_cycle(), r"field 'value\[1\]' contains itself"),
        ((1, 2), r"field 'value' is a tuple, which comes back from JSON as a list"),
        ([{"when": datetime.date(2026, 1, 1)}], r"field 'value\[0\].when' is a date"),
        # One level down and two: where a payload of scalars, lists and dicts takes no round trip, these do.
        ([1, (2, 3)], r"field 'value\[1\]' is a tuple"),
        ({"n": (1, 2)}, r"field 'value.n' is a tuple"),
        ({"n": {2: "two"}}, r"field 'value.n' has the key 2 of type int"),
        ([[(1,)]], r"field 'value\[0\]\[0\]' is a tuple"),
    ],
)
def test_dispatch_refuses_a_payload_that_does_not_survive_json(
    make_queue: QueueFactory, value: object, message: str
) -> None:
    queue = make_queue()
    queue.register(AnyPayload)
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.any_payload': payload .*" + message):
        queue.dispatch(AnyPayload(value))
    assert queue.pending_count() == 0


def test_a_refused_dispatch_loses_nothing_already_accepted(make_queue: QueueFactory) -> None:
    queue = make_queue()
    queue.register(AnyPayload)
    probe = Probe()
    queue.dispatch(ProbeJob(probe.id, 1))
    with pytest.raises(syncjobs.QueueError):
        queue.dispatch(AnyPayload({1, 2}))
    queue.dispatch(ProbeJob(probe.id, 2))
    assert queue.pending_count() == 2
    with queue:
        assert queue.join(WAIT)
    assert sorted(r["label"] for r in probe.runs) == [1, 2]


def test_a_to_payload_that_is_not_a_dict_is_refused(make_queue: QueueFactory) -> None:
    @dataclasses.dataclass
    class ListPayload(syncjobs.Job):
        NAME = "tests.list_payload"

        def to_payload(self) -> list[int]:  # type: ignore[override]
            return [1]

    queue = make_queue()
    queue.register(ListPayload)
    with pytest.raises(syncjobs.QueueError, match=r"'tests\.list_payload': to_payload\(\) must return a dict"):
        queue.dispatch(ListPayload())


@pytest.mark.parametrize(
    ("delay", "message"),
    [
        (-1, "delay must be >= 0"),
        (math.nan, "delay must be >= 0"),
        ("5", "delay must be seconds or a timedelta, got str"),
    ],
)
def test_a_bad_delay_is_refused(make_queue: QueueFactory, delay: object, message: str) -> None:
    queue = make_queue()
    with pytest.raises(syncjobs.QueueError, match=f"'tests.probe': {message}"):
        queue.dispatch(ProbeJob(Probe().id), delay=delay)  # type: ignore[arg-type]
    assert queue.pending_count() == 0


# -- outcomes ------------------------------------------------------------


def test_retryable_is_retried_and_then_succeeds(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters = dead_letters(queue)
    probe = Probe("retryable", "retryable", "ok")
    with queue:
        queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1, 2]
    assert letters == []


def test_any_exception_is_a_failed_run_and_the_worker_survives(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=1)
    letters = dead_letters(queue)
    crashing, after = Probe("crash"), Probe("ok")
    with queue:
        job_id = queue.dispatch(ThreeTimesJob(crashing.id))
        queue.dispatch(ProbeJob(after.id))
        assert queue.join(WAIT)
    assert crashing.attempts == [0, 1, 2]
    assert len(after.runs) == 1
    assert [(d.job_id, d.name, d.attempts, d.error) for d in letters] == [
        (job_id, "tests.three_times", 3, "job raised ValueError: boom")
    ]


def test_fatal_dead_letters_at_once(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters = dead_letters(queue)
    probe = Probe("fatal")
    with queue:
        job_id = queue.dispatch(ProbeJob(probe.id, label=3))
        assert queue.join(WAIT)
    assert probe.attempts == [0]
    assert letters == [syncjobs.DeadLetter(job_id, "tests.probe", {"probe": probe.id, "label": 3}, 1, "fatal: nope")]


def test_exhausted_retries_dead_letter_after_max_attempts_runs(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters = dead_letters(queue)
    probe = Probe("retryable")
    with queue:
        queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1, 2, 3, 4]  # MAX_ATTEMPTS defaults to 5 runs in all
    assert [(d.attempts, d.error) for d in letters] == [(5, "retryable: try again")]


def test_a_job_that_cannot_be_rebuilt_is_a_dead_letter(make_queue: QueueFactory) -> None:
    @dataclasses.dataclass
    class Undecodable(syncjobs.Job):
        NAME = "tests.undecodable"
        ran: bool = False

        @classmethod
        def from_payload(cls, data: dict[str, object]) -> Undecodable:
            raise KeyError("schema changed")

        def run(self) -> None:
            raise AssertionError("never runs")

    queue = make_queue()
    letters = dead_letters(queue)
    queue.register(Undecodable)
    with queue:
        queue.dispatch(Undecodable())
        assert queue.join(WAIT)
    assert [(d.attempts, d.error) for d in letters] == [
        (0, "cannot be run: payload does not fit 'tests.undecodable': KeyError: 'schema changed'")
    ]


def test_pending_count_drops_before_the_dead_letter_callback(make_queue: QueueFactory) -> None:
    queue = make_queue()
    seen: list[int] = []
    queue.on_dead_letter(lambda dead: seen.append(queue.pending_count()))
    with queue:
        queue.dispatch(OnceJob(Probe("fatal").id))
        assert queue.join(WAIT)
    wait_until(lambda: seen == [0], what="the callback")


def test_a_failing_callback_is_logged_and_the_worker_goes_on(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(workers=1)

    def broken(dead: syncjobs.DeadLetter) -> None:
        raise RuntimeError("callback broke")

    queue.on_dead_letter(broken)
    later = dead_letters(queue)  # a second callback still runs
    after = Probe("ok")
    with queue:
        queue.dispatch(OnceJob(Probe("fatal").id))
        queue.dispatch(ProbeJob(after.id))
        assert queue.join(WAIT)
    assert len(after.runs) == 1
    assert len(later) == 1
    failures = [r for r in caplog.records if "dead-letter callback" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].levelno == logging.ERROR
    assert failures[0].exc_info
    assert "callback broke" in str(failures[0].exc_info[1])


def test_without_a_callback_a_dead_letter_is_logged_at_error(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue()
    with queue:
        job_id = queue.dispatch(OnceJob(Probe("fatal").id))
        assert queue.join(WAIT)
    records = [r for r in caplog.records if "dead letter" in r.getMessage()]
    assert [(r.levelno, r.job_name, r.job_id) for r in records] == [(logging.ERROR, "tests.once", job_id)]  # type: ignore[attr-defined]
    assert job_id in records[0].getMessage()
    assert "fatal: nope" in records[0].getMessage()


def test_payloads_are_not_logged_at_info_or_above(make_queue: QueueFactory, caplog: pytest.LogCaptureFixture) -> None:
    queue = make_queue()
    queue.register(AnyPayload)

    @dataclasses.dataclass
    class Secretive(syncjobs.Job):
        NAME = "tests.secretive"
        MAX_ATTEMPTS = 2
        password: str

        def run(self) -> None:
            raise syncjobs.Retryable("no")

        def retry_wait(self, failed_attempt: int) -> float:
            return 0.0

    queue.register(Secretive)
    with queue:
        queue.dispatch(Secretive("hunter2-secret"))
        assert queue.join(WAIT)
    loud = [r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith("syncjobs")]
    assert loud, "the retry and the dead letter are reported"
    assert all("hunter2-secret" not in r.getMessage() for r in loud)
    assert all(hasattr(r, "job_id") and hasattr(r, "job_name") for r in loud)


# -- backoff, with the injected clock ------------------------------------


def test_retries_wait_one_then_two_seconds_by_the_queue_clock(backend: Backend) -> None:
    clock = FakeClock(1000.0)
    queue = backend.make(workers=1, clock=clock)
    probe = Probe("retryable", "retryable", "ok", wait=None)  # the default backoff
    with queue:
        job_id = queue.dispatch(ProbeJob(probe.id))
        probe.wait_finished(1)
        wait_until(lambda: queue.parked() == [(1001.0, job_id)], what="the first retry to be parked")  # type: ignore[attr-defined]
        clock.advance(0.999)
        assert queue.parked() == [(1001.0, job_id)]  # type: ignore[attr-defined]
        clock.advance(0.001)
        probe.wait_finished(2)
        wait_until(lambda: queue.parked() == [(1003.0, job_id)], what="the second retry to be parked")  # type: ignore[attr-defined]
        assert queue.pending_count() == 1
        clock.advance(2.0)
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1, 2]


def test_a_job_overrides_its_own_wait(backend: Backend) -> None:
    clock = FakeClock(0.0)
    queue = backend.make(workers=1, clock=clock)
    probe = Probe("retryable", "ok", wait=42.5)
    with queue:
        job_id = queue.dispatch(ProbeJob(probe.id))
        wait_until(lambda: queue.parked() == [(42.5, job_id)], what="the retry at 42.5 s")  # type: ignore[attr-defined]
        clock.advance(42.5)
        assert queue.join(WAIT)


def test_delay_holds_a_job_back(backend: Backend) -> None:
    clock = FakeClock(50.0)
    queue = backend.make(workers=1, clock=clock)
    probe = Probe()
    with queue:
        job_id = queue.dispatch(ProbeJob(probe.id), delay=datetime.timedelta(seconds=30))
        other = queue.dispatch(ProbeJob(probe.id), delay=2.5)
        assert queue.parked() == [(52.5, other), (80.0, job_id)]  # type: ignore[attr-defined]
        assert queue.pending_count() == 2
        clock.advance(2.5)
        probe.wait_finished(1)
        assert [r["id"] for r in probe.runs] == [other]
        clock.advance(27.5)
        assert queue.join(WAIT)
    assert [r["id"] for r in probe.runs] == [other, job_id]


def test_delay_really_waits_on_the_real_clock(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe()
    with queue:
        began = time.monotonic()
        queue.dispatch(ProbeJob(probe.id), delay=0.2)
        assert queue.join(WAIT)
        assert time.monotonic() - began >= 0.2


# -- context ---------------------------------------------------------------


def test_the_job_sees_the_dispatchers_context_and_leaks_nothing_back(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe("set_context")
    token = request_id.set("req-7")
    try:
        with queue:
            queue.dispatch(ProbeJob(probe.id))
            request_id.set("req-8")  # after dispatch: not what the job sees
            assert queue.join(WAIT)
        assert request_id.get() == "req-8"
    finally:
        request_id.reset(token)
    assert [r["request_id"] for r in probe.runs] == ["req-7"]


def test_each_run_starts_from_the_dispatch_context(make_queue: QueueFactory) -> None:
    queue = make_queue()
    # Run 0 sets the variable, then the retry must still see the dispatcher's value.
    probe = Probe("set_context", wait=0.0)
    seen: list[str] = []

    @dataclasses.dataclass
    class SetThenFail(syncjobs.Job):
        NAME = "tests.set_then_fail"

        def run(self) -> None:
            seen.append(request_id.get())
            request_id.set("set-by-run")
            if len(seen) == 1:
                raise syncjobs.Retryable("again")

        def retry_wait(self, failed_attempt: int) -> float:
            return 0.0

    queue.register(SetThenFail)
    token = request_id.set("req-1")
    try:
        with queue:
            queue.dispatch(SetThenFail())
            queue.dispatch(ProbeJob(probe.id))
            assert queue.join(WAIT)
    finally:
        request_id.reset(token)
    assert seen == ["req-1", "req-1"]


def test_a_job_dispatched_outside_any_scope_sees_the_defaults(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe()
    thread = threading.Thread(target=lambda: queue.dispatch(ProbeJob(probe.id)))
    token = request_id.set("only-in-the-test-thread")
    try:
        with queue:
            thread.start()
            thread.join(WAIT)
            assert queue.join(WAIT)
    finally:
        request_id.reset(token)
    assert [r["request_id"] for r in probe.runs] == ["no-request"]


def test_the_dead_letter_callback_sees_the_dispatchers_context(make_queue: QueueFactory) -> None:
    queue = make_queue()
    seen: list[str] = []

    def callback(dead: syncjobs.DeadLetter) -> None:
        seen.append(request_id.get())
        request_id.set("set-by-callback")

    queue.on_dead_letter(callback)
    token = request_id.set("req-dead")
    try:
        with queue:
            queue.dispatch(OnceJob(Probe("fatal").id))
            assert queue.join(WAIT)
        wait_until(lambda: len(seen) == 1, what="the callback")
        assert request_id.get() == "req-dead"
    finally:
        request_id.reset(token)
    assert seen == ["req-dead"]


def test_dispatches_share_an_unchanged_context_but_carry_each_rebinding_as_bound() -> None:
    queue = syncjobs.InMemoryJobQueue(workers=1)
    queue.register(ProbeJob)
    probe = Probe()
    # Equal, but not the same object: the job must get the one bound at its dispatch.
    first, second = "".join(["req", "-a"]), "".join(["req", "-a"])
    assert first == second
    assert first is not second
    token = request_id.set(first)
    try:
        with queue:
            queue.dispatch(ProbeJob(probe.id, 0))
            queue.dispatch(ProbeJob(probe.id, 1))
            request_id.set(second)
            queue.dispatch(ProbeJob(probe.id, 2))
            assert queue.join(WAIT)
    finally:
        request_id.reset(token)
    seen = {run["label"]: run["request_id"] for run in probe.runs}
    assert seen[0] is first
    assert seen[1] is first
    assert seen[2] is second


@dataclasses.dataclass
class Welcome(syncjobs.Job):
    NAME = "tests.welcome"
    user_id: int
    template: str
    locale: str

    def run(self) -> None:
        pass


def test_a_pending_in_memory_job_costs_at_most_300_bytes() -> None:
    queue = syncjobs.InMemoryJobQueue(workers=0)
    queue.register(Welcome)
    job = Welcome(12345, "welcome", "en")
    queue.dispatch(job)  # what the first dispatch sets up once
    jobs = 2000
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(jobs):
            queue.dispatch(job)
        per_job = (tracemalloc.get_traced_memory()[0] - before) / jobs
    finally:
        tracemalloc.stop()
    assert queue.pending_count() == jobs + 1
    # 261 bytes on Python 3.12 and 3.13, 269 on 3.11, 283 on 3.10 (whose dict
    # entries and str headers are larger); the index by id that status() and
    # cancel() need is a dict entry of those.
    assert per_job <= 300, f"{per_job:.0f} bytes per pending job"


WELCOME = Welcome(12345, "welcome", "en")


@pytest.fixture
def kept_results_queue(caplog: pytest.LogCaptureFixture) -> Iterator[syncjobs.InMemoryJobQueue]:
    """An in-memory queue keeping results, running, with one job done (what the first sets up once) and collected."""
    caplog.set_level(logging.INFO, logger="syncjobs")  # not the suite's DEBUG: its records would be kept
    queue = syncjobs.InMemoryJobQueue(workers=2, keep_result=600)
    queue.register(Welcome)
    with queue:
        queue.dispatch(WELCOME)
        assert queue.join(WAIT)
        gc.collect()
        yield queue


def test_a_finished_in_memory_job_kept_for_status_leaves_nothing_for_the_garbage_collector_to_walk(
    kept_results_queue: syncjobs.InMemoryJobQueue,
) -> None:
    # Each collection of the oldest generation walks every object it tracks: a
    # kept record it tracked cost every job some 3 µs once thousands were kept.
    queue = kept_results_queue
    jobs = 2000
    before = len(gc.get_objects())
    first = str(queue.dispatch(WELCOME))  # the id alone: a handle is an object the collector tracks
    for _ in range(jobs - 1):
        queue.dispatch(WELCOME)
    assert queue.join(WAIT)
    gc.collect()
    tracked = len(gc.get_objects()) - before
    kept = queue.status(first)
    assert kept is not None
    assert kept.state == "done"
    assert tracked < jobs / 10, f"{tracked} more objects tracked after {jobs} jobs kept"


def test_an_in_memory_run_leaves_no_reference_cycle_for_the_garbage_collector(
    kept_results_queue: syncjobs.InMemoryJobQueue,
) -> None:
    # Garbage in a cycle waits for the collector, whose collections it brings on: some 9 objects a run
    # (the run, its RunInfo and what they held) cost each job 0.7 µs, an eighth of a no-op job.
    queue = kept_results_queue
    jobs = 1000
    gc.disable()
    try:
        for _ in range(jobs):
            queue.dispatch(WELCOME)
        assert queue.join(WAIT)
        cyclic = gc.collect()
    finally:
        gc.enable()
    assert cyclic < jobs / 10, f"{cyclic} objects in reference cycles left by {jobs} runs"


# -- current_job -----------------------------------------------------------


def test_current_job_inside_and_outside_a_run(make_queue: QueueFactory) -> None:
    assert syncjobs.current_job() is None
    queue = make_queue()
    probe = Probe("retryable", "ok")
    with queue:
        job_id = queue.dispatch(ThreeTimesJob(probe.id))
        assert queue.join(WAIT)
    infos = [r["info"] for r in probe.runs]
    assert [(i.id, i.name, i.attempt, i.max_attempts) for i in infos] == [
        (job_id, "tests.three_times", 0, 3),
        (job_id, "tests.three_times", 1, 3),
    ]
    assert all(isinstance(i.cancelled, threading.Event) and not i.cancelled.is_set() for i in infos)
    assert syncjobs.current_job() is None


# -- start and shutdown ---------------------------------------------------


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("syncjobs-worker")]


def test_start_twice_is_a_no_op(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=3)
    before = set(_worker_threads())
    probe = Probe("block")
    queue.start()
    queue.start()
    for _ in range(3):
        queue.dispatch(ProbeJob(probe.id))
    probe.wait_runs(3)
    assert len(set(_worker_threads()) - before) == 3
    probe.release.set()
    assert queue.join(WAIT)
    queue.shutdown()


def test_held_workers_take_no_job_until_released_and_a_shutdown_releases_them(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe()
    queue.start(held=True)  # never released: only the shutdown lets them go
    queue.dispatch(ProbeJob(probe.id))
    began = time.monotonic()
    queue.shutdown(grace=5)
    assert time.monotonic() - began < 5  # nothing ran, so nothing to wait for
    assert probe.runs == []
    assert queue.pending_count() == 1
    queue.start(held=True)
    with pytest.raises(syncjobs.QueueError, match="workers run already"):
        queue.start(held=True)
    queue.release()
    probe.wait_finished(1)
    queue.shutdown()
    assert [r["attempt"] for r in probe.runs] == [0]


def test_start_after_shutdown_starts_a_fresh_set(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe()
    with queue:
        queue.dispatch(ProbeJob(probe.id, 1))
        assert queue.join(WAIT)
    queue.dispatch(ProbeJob(probe.id, 2))
    assert queue.pending_count() == 1
    with queue:
        assert queue.join(WAIT)
    assert [r["label"] for r in probe.runs] == [1, 2]


def test_shutdown_before_start_and_twice_is_harmless(make_queue: QueueFactory) -> None:
    queue = make_queue()
    queue.shutdown()
    queue.start()
    queue.shutdown()
    queue.shutdown()
    assert queue.pending_count() == 0


def test_running_jobs_finishing_within_the_grace_are_waited_for(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters = dead_letters(queue)
    probe = Probe("block")
    queue.start()
    queue.dispatch(ProbeJob(probe.id))
    probe.wait_runs(1)
    thread, took = shutdown_in_thread(queue, grace=WAIT)
    probe.release.set()
    thread.join(WAIT)
    assert took
    assert took[0] < WAIT
    assert len(probe.finished) == 1
    assert probe.attempts == [0]
    assert queue.pending_count() == 0
    assert letters == []


@dataclasses.dataclass
class Finishing(syncjobs.Job):
    """Says it began, then computes for ``spin`` seconds, holding the GIL: it ends as shutdown takes runs back."""

    NAME = "tests.finishing"
    spin: float
    began: ClassVar[threading.Event]
    runs: ClassVar[list[float]]

    def run(self) -> None:
        Finishing.runs.append(self.spin)
        Finishing.began.set()
        until = time.perf_counter() + self.spin
        while time.perf_counter() < until:
            pass


@pytest.mark.timeout(120)
def test_a_run_finishing_as_shutdown_hands_it_back_has_one_outcome_applied() -> None:
    # The worker and shutdown race to take the run: whichever takes it applies
    # its outcome. Both would run the job again after it was done, or finish
    # it twice (a worker crash on the pending count, caught by the suite).
    outcomes = []
    # Around the interpreter's switch interval (5 ms), when the waiting test
    # thread takes the GIL back to shut down.
    for step in range(100):
        spin = step * sys.getswitchinterval() * 2 / 100
        Finishing.began, Finishing.runs = threading.Event(), []
        queue = syncjobs.InMemoryJobQueue(workers=1)
        queue.register(Finishing)
        queue.start()
        queue.dispatch(Finishing(spin))
        assert Finishing.began.wait(WAIT)
        queue.shutdown(grace=0)
        handed_back = queue.pending_count()
        assert handed_back in {0, 1}
        with queue:
            assert queue.join(WAIT)
        assert len(Finishing.runs) == 1 + handed_back
        assert queue.pending_count() == 0
        outcomes.append(handed_back)
    assert 0 in outcomes  # the worker took some runs first (the race was run both ways,
    assert 1 in outcomes  # or the test did not test it)


def test_queued_jobs_stay_queued_at_shutdown(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=1)
    blocker, queued = Probe("block"), Probe()
    queue.start()
    queue.dispatch(ProbeJob(blocker.id))
    blocker.wait_runs(1)
    for label in range(3):
        queue.dispatch(ProbeJob(queued.id, label))
    thread, _ = shutdown_in_thread(queue, grace=WAIT)
    blocker.release.set()
    thread.join(WAIT)
    assert queued.runs == []
    assert queue.pending_count() == 3
    with queue:
        assert queue.join(WAIT)
    assert sorted(r["label"] for r in queued.runs) == [0, 1, 2]


def test_past_the_grace_a_cooperative_job_is_cancelled_and_handed_back(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue()
    letters = dead_letters(queue)
    probe = Probe("cooperate", "ok")
    queue.start()
    job_id = queue.dispatch(ProbeJob(probe.id))
    probe.wait_runs(1)
    began = time.monotonic()
    queue.shutdown(grace=0.1)
    assert time.monotonic() - began < 0.1 + SHUTDOWN_MARGIN
    assert probe.runs[0]["info"].cancelled.is_set()
    wait_late_finish_dropped(caplog, job_id)
    assert queue.pending_count() == 1
    assert letters == []
    with queue:  # the run was spent: the next one is attempt 1
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1]
    assert {r["id"] for r in probe.runs} == {job_id}


def test_a_start_that_cannot_start_every_worker_stops_the_rest_and_hands_their_job_back(
    make_queue: QueueFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Once the interpreter exits, Python 3.12+ refuses new threads: a start()
    # racing it gets one worker running (and taking a job), then an error.
    probe = Probe("cooperate", "ok")

    class RefusesTheSecondThread(concurrent.futures.ThreadPoolExecutor):
        submitted = 0

        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            RefusesTheSecondThread.submitted += 1
            if RefusesTheSecondThread.submitted == 2:
                probe.wait_runs(1)  # the first worker has taken the job
                raise RuntimeError("can't create new thread at interpreter shutdown")
            return super().submit(fn, *args, **kwargs)

    queue = make_queue(shutdown_grace=0.1)
    letters = dead_letters(queue)
    job_id = queue.dispatch(ProbeJob(probe.id))
    monkeypatch.setattr(syncjobs.worker, "ThreadPoolExecutor", RefusesTheSecondThread)
    with pytest.raises(RuntimeError, match="can't create new thread"):
        queue.start()
    monkeypatch.undo()
    # Stopped as shutdown() would: cancelled after the grace, no worker left, the job back in the queue.
    assert probe.runs[0]["info"].cancelled.is_set()
    wait_late_finish_dropped(caplog, job_id)
    assert queue.worker_threads() == []
    assert queue.pending_count() == 1
    assert letters == []
    with queue:  # a later start() works, and the run was spent
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1]


def test_shutdown_returns_on_time_when_a_job_ignores_cancellation(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue()
    letters = dead_letters(queue)
    probe = Probe("block", "ok")
    queue.start()
    job_id = queue.dispatch(ProbeJob(probe.id))
    probe.wait_runs(1)
    began = time.monotonic()
    queue.shutdown(grace=0.2)
    assert time.monotonic() - began < 0.2 + SHUTDOWN_MARGIN
    assert probe.finished == []  # still running, left behind
    assert queue.pending_count() == 1
    probe.release.set()
    wait_late_finish_dropped(caplog, job_id)
    # Its late success is void: not counted done, no dead letter.
    assert queue.pending_count() == 1
    assert letters == []
    with queue:
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1]
    assert queue.pending_count() == 0


def test_a_late_failure_of_an_abandoned_run_is_void_too(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    @dataclasses.dataclass
    class FailsLate(syncjobs.Job):
        NAME = "tests.fails_late"
        MAX_ATTEMPTS = 2

        def run(self) -> None:
            started.set()
            assert release.wait(WAIT)
            raise syncjobs.Fatal("too late")

    started, release = threading.Event(), threading.Event()
    queue = make_queue()
    letters = dead_letters(queue)
    queue.register(FailsLate)
    queue.start()
    job_id = queue.dispatch(FailsLate())
    assert started.wait(WAIT)
    queue.shutdown(grace=0)
    release.set()
    wait_late_finish_dropped(caplog, job_id)
    assert letters == []
    assert queue.pending_count() == 1


def test_a_run_aborted_at_shutdown_on_its_last_attempt_is_a_dead_letter(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters = dead_letters(queue)
    probe = Probe("cooperate")
    queue.start()
    job_id = queue.dispatch(OnceJob(probe.id))
    probe.wait_runs(1)
    queue.shutdown(grace=0)
    assert [(d.job_id, d.attempts, d.error) for d in letters] == [
        (job_id, 1, "aborted at shutdown on its last attempt (1 of 1)")
    ]
    assert queue.pending_count() == 0


def test_a_job_raising_cancelled_is_handed_back_with_its_run_spent(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters = dead_letters(queue)
    probe = Probe("cancel", "ok")
    with queue:
        queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1]
    assert letters == []


def test_cancelled_is_not_swallowed_by_except_exception() -> None:
    assert not issubclass(syncjobs.Cancelled, Exception)
    assert issubclass(syncjobs.Cancelled, BaseException)


def test_parked_retries_keep_their_due_time_across_shutdown(backend: Backend) -> None:
    clock = FakeClock(10.0)
    queue = backend.make(workers=1, clock=clock)
    probe = Probe("retryable", "ok", wait=None)
    queue.start()
    job_id = queue.dispatch(ProbeJob(probe.id))
    wait_until(lambda: queue.parked() == [(11.0, job_id)], what="the retry to be parked")  # type: ignore[attr-defined]
    queue.shutdown()
    assert queue.parked() == [(11.0, job_id)]  # type: ignore[attr-defined]
    assert queue.pending_count() == 1
    clock.advance(5.0)
    assert probe.attempts == [0]  # nothing runs while shut down
    with queue:
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1]


def test_dispatch_during_the_drain_queues_the_job(make_queue: QueueFactory) -> None:
    queue = make_queue()
    blocker, late = Probe("block"), Probe()
    queue.start()
    queue.dispatch(ProbeJob(blocker.id))
    blocker.wait_runs(1)
    thread, _ = shutdown_in_thread(queue, grace=WAIT)
    wait_until(lambda: not queue._pool.started, what="shutdown to begin")  # type: ignore[attr-defined]
    queue.dispatch(ProbeJob(late.id))
    blocker.release.set()
    thread.join(WAIT)
    assert late.runs == []
    assert queue.pending_count() == 1
    with queue:
        assert queue.join(WAIT)
    assert len(late.runs) == 1


def test_shutdown_shares_one_deadline_across_workers(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=4)
    probe = Probe("block")
    queue.start()
    for _ in range(4):
        queue.dispatch(ProbeJob(probe.id))
    probe.wait_runs(4)
    began = time.monotonic()
    queue.shutdown(grace=1.0)
    # Four stuck workers, grace per worker would take 4 s.
    assert time.monotonic() - began < 1.0 + SHUTDOWN_MARGIN
    assert all(r["info"].cancelled.is_set() for r in probe.runs)
    assert queue.pending_count() == 4


def test_shutdown_grace_defaults_to_the_queue_setting(make_queue: QueueFactory) -> None:
    assert syncjobs.DEFAULT_SHUTDOWN_GRACE == 5.0
    assert make_queue().shutdown_grace == 5.0  # type: ignore[attr-defined]
    queue = make_queue(shutdown_grace=0.1)
    probe = Probe("block")
    queue.start()
    queue.dispatch(ProbeJob(probe.id))
    probe.wait_runs(1)
    began = time.monotonic()
    queue.shutdown()
    assert time.monotonic() - began < 0.1 + SHUTDOWN_MARGIN
    assert probe.runs[0]["info"].cancelled.is_set()


@pytest.mark.parametrize("grace", [-1, math.inf, "5"])
def test_a_bad_grace_is_refused(make_queue: QueueFactory, grace: object) -> None:
    with pytest.raises(ValueError, match="grace must be a number of seconds"):
        make_queue().shutdown(grace=grace)  # type: ignore[arg-type]


# -- join -----------------------------------------------------------------


def test_join_times_out_while_a_job_runs_and_succeeds_after(make_queue: QueueFactory) -> None:
    queue = make_queue()
    probe = Probe("block")
    with queue:
        queue.dispatch(ProbeJob(probe.id))
        probe.wait_runs(1)
        assert queue.pending_count() == 1
        assert queue.join(timeout=0.05) is False
        probe.release.set()
        assert queue.join(WAIT) is True
        assert queue.pending_count() == 0


def test_pending_count_counts_queued_running_and_parked(backend: Backend) -> None:
    clock = FakeClock()
    queue = backend.make(workers=1, clock=clock)
    running, parked, queued = Probe("block"), Probe("retryable", "ok", wait=60.0), Probe()
    with queue:
        queue.dispatch(ProbeJob(parked.id))
        parked.wait_finished(1)
        queue.dispatch(ProbeJob(running.id))
        running.wait_runs(1)
        queue.dispatch(ProbeJob(queued.id))
        assert queue.pending_count() == 3
        running.release.set()
        wait_until(lambda: queue.pending_count() == 1, what="running and queued to finish")
        clock.advance(60.0)
        assert queue.join(WAIT)


def test_the_queue_satisfies_the_protocol(make_queue: QueueFactory) -> None:
    assert isinstance(make_queue(), syncjobs.JobQueue)


def test_a_crashed_worker_loop_is_reported_as_an_uncaught_thread_exception(
    make_queue: QueueFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reported: list[BaseException | None] = []
    reported_event = threading.Event()

    def hook(args: threading.ExceptHookArgs) -> None:
        reported.append(args.exc_value)
        reported_event.set()

    queue = make_queue(workers=1)

    def broken_claim(stopping: threading.Event) -> None:
        raise RuntimeError("store broke")

    monkeypatch.setattr(queue._store, "claim", broken_claim)  # type: ignore[attr-defined]
    monkeypatch.setattr(threading, "excepthook", hook)
    queue.start()
    assert reported_event.wait(WAIT)
    assert [str(exc) for exc in reported] == ["store broke"]
    crashed = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert [r.getMessage() for r in crashed] == ["a syncjobs worker loop crashed"]
    caplog.clear()  # seen and asserted: the autouse guard need not fail this test


def test_quick_restarts_leave_no_worker_behind(make_queue: QueueFactory) -> None:
    # shutdown(grace=0) right after start(): idle workers have not yet taken
    # their wake-up. None may stay blocked to take a later generation's work.
    before = set(threading.enumerate())
    queue = make_queue(workers=4)
    for _ in range(20):
        queue.start()
        queue.shutdown(grace=0)
    probe = Probe()
    with queue:
        for label in range(50):
            queue.dispatch(ProbeJob(probe.id, label))
        assert queue.join(WAIT)
    assert sorted(r["label"] for r in probe.runs) == list(range(50))
    wait_until(
        lambda: not [t for t in set(threading.enumerate()) - before if t.name.startswith("syncjobs-worker")],
        what="every worker thread of the queue to exit",
    )


def test_a_delay_of_centuries_does_not_stop_the_timer(make_queue: QueueFactory) -> None:
    queue = make_queue()
    far, near = Probe(), Probe()
    with queue:
        queue.dispatch(ProbeJob(far.id), delay=1e15)  # past threading.TIMEOUT_MAX
        queue.dispatch(ProbeJob(near.id), delay=0.01)
        near.wait_finished(1)
        wait_until(lambda: queue.pending_count() == 1, what="the near job to be done")
        assert far.runs == []


def test_a_callback_calling_sys_exit_does_not_stop_the_worker(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(workers=1)

    def exits(dead: syncjobs.DeadLetter) -> None:
        raise SystemExit(3)

    queue.on_dead_letter(exits)
    after = Probe()
    with queue:
        queue.dispatch(OnceJob(Probe("fatal").id))
        queue.dispatch(ProbeJob(after.id))
        assert queue.join(WAIT)
    assert len(after.runs) == 1
    assert [r.levelno for r in caplog.records if "dead-letter callback" in r.getMessage()] == [logging.ERROR]


def test_a_job_dispatched_from_a_job_is_not_the_parents_run(make_queue: QueueFactory) -> None:
    queue = make_queue()
    seen_in_callback: list[object] = []
    queue.on_dead_letter(lambda dead: seen_in_callback.append(syncjobs.current_job()))
    child = Probe("fatal")

    @dataclasses.dataclass
    class Parent(syncjobs.Job):
        NAME = "tests.parent"

        def run(self) -> None:
            queue.dispatch(OnceJob(child.id))

    queue.register(Parent)
    with queue:
        queue.dispatch(Parent())
        assert queue.join(WAIT)
    wait_until(lambda: len(seen_in_callback) == 1, what="the child's dead letter")
    assert seen_in_callback == [None]
    assert [r["name"] for r in child.runs] == ["tests.once"]


def test_a_payload_nested_too_deeply_is_a_queue_error(make_queue: QueueFactory) -> None:
    queue = make_queue()
    queue.register(AnyPayload)
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(syncjobs.QueueError, match=r"'tests\.any_payload': payload is nested too deeply"):
        queue.dispatch(AnyPayload(deep))
    assert queue.pending_count() == 0


def test_from_payload_and_retry_wait_run_in_the_dispatch_context(make_queue: QueueFactory) -> None:
    seen: list[tuple[str, str]] = []
    outside: list[syncjobs.RunInfo | None] = []

    @dataclasses.dataclass
    class Contextual(syncjobs.Job):
        NAME = "tests.contextual"
        MAX_ATTEMPTS = 2

        @classmethod
        def from_payload(cls, data: dict[str, object]) -> Contextual:
            seen.append(("from_payload", request_id.get()))
            return cls()

        def run(self) -> None:
            request_id.set("set by the run")  # the run's own context: neither retry_wait nor the next run sees it
            raise syncjobs.Retryable("again")

        def retry_wait(self, failed_attempt: int) -> float:
            seen.append(("retry_wait", request_id.get()))
            outside.append(syncjobs.current_job())
            return 0.0

    queue = make_queue()
    queue.register(Contextual)
    token = request_id.set("req-ctx")
    try:
        with queue:
            queue.dispatch(Contextual())
            assert queue.join(WAIT)
    finally:
        request_id.reset(token)
    assert seen == [("from_payload", "req-ctx"), ("retry_wait", "req-ctx"), ("from_payload", "req-ctx")]
    assert outside == [None]  # retry_wait() is not part of the run


def test_a_retry_waits_at_least_its_backoff_by_the_real_clock(make_queue: QueueFactory) -> None:
    # Every backend, whatever its clock: a lower bound cannot be flaky.
    queue = make_queue(workers=1)
    probe = Probe("retryable", "ok", wait=0.3)
    with queue:
        queue.dispatch(ProbeJob(probe.id))
        assert queue.join(WAIT)
    assert probe.attempts == [0, 1]
    assert probe.runs[1]["at"] - probe.runs[0]["at"] >= 0.3 - 0.01
