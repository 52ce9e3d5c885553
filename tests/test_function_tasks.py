"""Function tasks (``@queue.task``) and ``run_at=``, on every backend through the contract fixture."""

from __future__ import annotations

import datetime
import functools
import math
import threading
import time
import zoneinfo
from typing import Any

import pytest
import tenacity

import syncjobs
from tests import typed_tasks
from tests.conftest import Backend, QueueFactory
from tests.helpers import WAIT, FakeClock, Probe, ProbeJob, request_id, wait_until
from tests.test_database import user_connection

pytestmark = pytest.mark.timeout(60)


class Calls:
    """What a task's runs saw, for the test to wait on."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self._cond = threading.Condition()

    def add(self, value: Any) -> None:
        with self._cond:
            self.seen.append(value)
            self._cond.notify_all()

    def wait(self, count: int) -> list[Any]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.seen) >= count, WAIT), f"saw {self.seen}"
            return list(self.seen)


def module_level(user_id: int) -> int:
    return user_id


# -- dispatch and running -------------------------------------------------------


def test_a_task_runs_with_the_arguments_it_was_dispatched_with(make_queue: QueueFactory) -> None:
    queue = make_queue()
    calls = Calls()

    @queue.task(name="tests.record")
    def record(a: int, b: int = 2, *rest: int, key: str | None = None, **extra: Any) -> None:
        info = syncjobs.current_job()
        assert info is not None
        calls.add((info.id, info.name, a, b, rest, key, extra))

    with queue:
        first = record.dispatch(1)
        second = record.dispatch(1, b=5, key="k")
        third = record.dispatch(1, 2, 3, 4, key="k", colour="red")
        assert queue.join(WAIT)
    assert len({first, second, third}) == 3
    assert sorted(calls.wait(3)) == sorted(
        [
            (first, "tests.record", 1, 2, (), None, {}),
            (second, "tests.record", 1, 5, (), "k", {}),
            (third, "tests.record", 1, 2, (3, 4), "k", {"colour": "red"}),
        ]
    )


def test_a_task_given_every_parameter_by_name_runs_with_them(make_queue: QueueFactory) -> None:
    queue = make_queue()
    calls = Calls()

    @queue.task(name="tests.by_name")
    def by_name(a: int, b: str = "b", *, c: list[int], d: dict[str, Any] | None = None) -> None:
        calls.add((a, b, c, d))

    with queue:
        by_name.dispatch(c=[3], d={"x": None}, b="B", a=1)  # every one, in any order
        by_name.dispatch(1, b="B", c=[3])
        with pytest.raises(syncjobs.QueueError, match=r"by_name\(\) missing 1 required keyword-only argument: 'c'"):
            by_name.dispatch(a=1, b="B", d=None)  # type: ignore[call-arg]
        assert queue.join(WAIT)
    assert sorted(calls.wait(2), key=repr) == [(1, "B", [3], None), (1, "B", [3], {"x": None})]


def test_calling_a_task_calls_its_function_here_and_enqueues_nothing(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=0)

    @queue.task(name="tests.add")
    def add(a: int, b: int) -> int:
        return a + b

    assert add(2, 3) == 5
    assert add.__name__ == "add"
    assert add.__wrapped__ is add.function  # type: ignore[attr-defined]
    assert queue.pending_count() == 0


def test_arguments_travel_by_name_so_a_reordered_function_still_gets_them_right(make_queue: QueueFactory) -> None:
    before, after = make_queue(), make_queue()
    calls = Calls()

    @before.task(name="tests.reordered", max_attempts=1)
    def old(a: int, b: int, /, c: int, d: int = 0, *, e: int = 0) -> None:
        raise syncjobs.Fatal("show the payload")

    @after.task(name="tests.reordered")
    def new(a: int, b: int, /, d: int = 0, c: int = 0, *, e: int = 0) -> None:
        calls.add((a, b, c, d, e))

    letters: list[syncjobs.DeadLetter] = []
    before.on_dead_letter(letters.append)
    with before:
        old.dispatch(1, 2, 3, 4, e=5)
        assert before.join(WAIT)
    [letter] = letters
    payload = letter.payload
    assert payload == {"args": [1, 2], "kwargs": {"c": 3, "d": 4, "e": 5}}
    with after:  # the same job, after a deploy that swapped c and d
        after.dispatch(new.job_class(payload["args"], payload["kwargs"]))
        assert after.join(WAIT)
    assert calls.seen == [(1, 2, 3, 4, 5)]


def test_a_call_that_fills_star_args_keeps_its_positions(make_queue: QueueFactory) -> None:
    queue = make_queue()
    calls = Calls()
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)

    @queue.task(name="tests.spread", max_attempts=1)
    def spread(first: int, *rest: int, **extra: int) -> None:
        calls.add((first, rest, extra))
        raise syncjobs.Fatal("show the payload")

    with queue:
        spread.dispatch(1)
        spread.dispatch(1, 2, 3, x=4)
        assert queue.join(WAIT)
    assert sorted(calls.seen) == [(1, (), {}), (1, (2, 3), {"x": 4})]
    assert sorted(str(d.payload) for d in letters) == [
        "{'args': [1, 2, 3], 'kwargs': {'x': 4}}",
        "{'args': [], 'kwargs': {'first': 1}}",
    ]


def test_a_wrapped_function_is_checked_by_the_wrappers_own_signature(make_queue: QueueFactory) -> None:
    queue = make_queue()
    calls = Calls()

    def with_session(function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(user_id: int) -> None:
            function("session", user_id)

        return wrapper

    @queue.task(name="tests.wrapped")
    @with_session
    def wrapped(session: str, user_id: int) -> None:
        calls.add((session, user_id))

    with queue:
        wrapped.dispatch(42)
        with pytest.raises(syncjobs.QueueError, match=r"wrapped\(\) takes 1 positional argument but 2 were given"):
            wrapped.dispatch("session", 42)
        assert queue.join(WAIT)
    assert calls.seen == [("session", 42)]


def test_a_refused_option_is_not_hidden_by_an_argument_python_binds_oddly(make_queue: QueueFactory) -> None:
    queue = make_queue(workers=0)

    @queue.task(name="tests.odd")
    def odd(a: int, b: int = 1, /, **extra: Any) -> None:
        pass

    # b is positional-only and also a key of **extra: Python accepts it, Signature.bind() did not.
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.odd': delay must be >= 0 and finite"):
        odd.using(delay=-1).dispatch(1, b=2)
    with pytest.raises(syncjobs.QueueError, match=r"task 'tests.odd': argument 'x' is an object"):
        odd.dispatch(1, b=2, x=object())
    assert queue.pending_count() == 0


def test_a_task_is_named_by_its_dotted_path_unless_given_a_name() -> None:
    queue = syncjobs.InMemoryJobQueue(workers=0)
    task = queue.task(module_level)
    named = queue.task(name="stable.name", max_attempts=2)(module_level)
    assert task.name == "tests.test_function_tasks.module_level"
    assert named.name == "stable.name"
    assert named.job_class.MAX_ATTEMPTS == 2
    assert queue.registered_names() == ["stable.name", "tests.test_function_tasks.module_level"]
    assert typed_tasks.send_welcome.name == "tests.typed_tasks.send_welcome"


def test_what_a_worker_could_not_import_is_refused_at_decoration() -> None:
    queue = syncjobs.InMemoryJobQueue(workers=0)

    def nested(x: int) -> None:
        pass

    with pytest.raises(TypeError, match=r"test_function_tasks\..*nested is not a module-level function"):
        queue.task(nested)
    with pytest.raises(TypeError, match="not a module-level function"):
        queue.task(lambda x: x)
    with pytest.raises(TypeError, match="takes a plain function, got <built-in function len>"):
        queue.task(len)
    with pytest.raises(TypeError, match="takes a plain function"):
        queue.task(ProbeJob)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Calls\.add is not a module-level function"):
        queue.task(Calls.add)  # a method: a Task is no descriptor, it would never get its self
    assert queue.registered_names() == []


def test_bad_task_options_are_refused_at_decoration() -> None:
    queue = syncjobs.InMemoryJobQueue(workers=0)
    with pytest.raises(
        TypeError,
        match=r"unexpected argument\(s\) queue; it takes keep_result, limit, max_attempts, name, priority, retry_wait",
    ):
        queue.task(name="x", queue="reports")(module_level)
    with pytest.raises(TypeError, match="MAX_ATTEMPTS must be an int >= 1"):
        queue.task(name="x", max_attempts=0)(module_level)
    with pytest.raises(TypeError, match="needs a NAME"):
        queue.task(name=" ")(module_level)
    with pytest.raises(TypeError, match="retry_wait must be a function of the failed attempt or a tenacity wait"):
        queue.task(name="x", retry_wait=5)(module_level)  # type: ignore[arg-type]
    assert queue.registered_names() == []


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, r"task 'tests.bad_args': bad_args\(\) missing 1 required positional argument: 'user_id'"),
        ((1, 2, 3), {}, r"task 'tests.bad_args': bad_args\(\) takes from 1 to 2 positional arguments but 3 were given"),
        ((1,), {"colour": "red"}, r"task 'tests.bad_args': bad_args\(\) got an unexpected keyword argument 'colour'"),
        (({1, 2},), {}, r"task 'tests.bad_args': argument 'user_id' is a set, which is not JSON-serializable"),
        (((1, 2),), {}, r"argument 'user_id' is a tuple, which comes back from JSON as a list"),
        ((1, {"a": [0.5, math.nan]}), {}, r"argument 'options.a\[1\]' is nan, which JSON cannot represent"),
        ((1,), {"options": {3: "x"}}, r"argument 'options' has the key 3 of type int; JSON keys are strings"),
        # Every parameter by name: the call binds without a check; what it carries is checked all the same.
        ((), {"user_id": (1, 2), "options": None}, r"argument 'user_id' is a tuple, which comes back from JSON"),
        ((), {"user_id": 1, "options": {"a": {3: "x"}}}, r"argument 'options.a' has the key 3 of type int"),
        ((), {"user_id": 1, "options": [math.inf]}, r"argument 'options\[0\]' is inf, which JSON cannot represent"),
    ],
)
def test_bad_arguments_are_refused_naming_the_task_and_the_parameter(
    make_queue: QueueFactory, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    queue = make_queue(workers=0)

    @queue.task(name="tests.bad_args")
    def bad_args(user_id: Any, options: Any = None) -> None:
        pass

    accepted = bad_args.dispatch(7)
    with pytest.raises(syncjobs.QueueError, match=message):
        bad_args.dispatch(*args, **kwargs)
    assert queue.pending_count() == 1, "nothing of the refused call is enqueued, nothing accepted is lost"
    assert accepted


def test_a_failing_task_follows_its_own_policy_and_dead_letters_with_its_arguments(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)
    calls = Calls()

    @queue.task(name="tests.flaky", max_attempts=2, retry_wait=lambda failed: 0.0)
    def flaky(user_id: int, *, reason: str) -> None:
        calls.add(user_id)
        raise ValueError(reason)

    with queue:
        job_id = flaky.dispatch(7, reason="boom")
        assert queue.join(WAIT)
    assert calls.wait(2) == [7, 7]
    payload = {"args": [], "kwargs": {"user_id": 7, "reason": "boom"}}  # by name: see the reordering test
    assert letters == [syncjobs.DeadLetter(job_id, "tests.flaky", payload, 2, "job raised ValueError: boom")]


def test_a_tasks_retry_wait_may_be_a_tenacity_strategy(backend: Backend) -> None:
    clock = FakeClock(0.0)
    queue = backend.make(workers=1, clock=clock)
    calls = Calls()

    @queue.task(name="tests.tenacious", retry_wait=tenacity.wait_fixed(7))
    def tenacious() -> None:
        calls.add(None)
        if len(calls.seen) == 1:
            raise syncjobs.Retryable("once")

    with queue:
        job_id = tenacious.dispatch()
        wait_until(lambda: queue.parked() == [(7.0, job_id)], what="the retry parked at 7 s")
        clock.advance(7.0)
        assert queue.join(WAIT)
    assert len(calls.seen) == 2


def test_a_task_sees_the_dispatchers_context(make_queue: QueueFactory) -> None:
    queue = make_queue()
    calls = Calls()

    @queue.task(name="tests.whoami")
    def whoami() -> None:
        calls.add(request_id.get())

    token = request_id.set("req-42")
    try:
        with queue:
            whoami.dispatch()
            assert queue.join(WAIT)
    finally:
        request_id.reset(token)
    assert calls.wait(1) == ["req-42"]


def test_a_payload_that_no_longer_fits_the_task_is_a_dead_letter(make_queue: QueueFactory) -> None:
    queue = make_queue()
    letters: list[syncjobs.DeadLetter] = []
    queue.on_dead_letter(letters.append)

    @queue.task(name="tests.reshaped")
    def reshaped(x: int) -> None:
        raise AssertionError("never runs")

    with queue:
        queue.dispatch(reshaped.job_class("not a list", {}))  # type: ignore[arg-type]
        assert queue.join(WAIT)
    [letter] = letters
    assert "a payload must be {'args': [...], 'kwargs': {...}}" in letter.error


def test_the_typed_example_dispatches_what_it_says() -> None:
    queue = typed_tasks.queue
    called, *ids = typed_tasks.good_calls()
    assert called == "welcome 42 (en)"
    assert len(set(ids)) == 5
    assert queue.pending_count() == 5
    with queue:
        assert queue.join(WAIT)


# -- dispatch options: delay, run_at, using() -------------------------------------


def test_using_sets_options_on_a_new_task_and_refuses_unknown_ones(backend: Backend) -> None:
    clock = FakeClock(100.0)
    queue = backend.make(workers=0, clock=clock)

    @queue.task(name="tests.later")
    def later() -> None:
        pass

    delayed = later.using(delay=30)
    assert delayed is not later
    late_id = delayed.dispatch()
    now_id = later.dispatch()
    assert sorted(queue.parked()) == [(130.0, late_id)]
    assert queue.pending_count() == 2
    with pytest.raises(TypeError, match=r"task 'tests.later': using\(\) got unexpected option\(s\) dealy; it takes"):
        later.using(dealy=5)
    assert now_id


def aware(seconds_from_now: float, zone: str) -> datetime.datetime:
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds_from_now)
    return moment.astimezone(zoneinfo.ZoneInfo(zone))


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kathmandu"])
def test_run_at_holds_a_job_back_until_that_moment_in_any_time_zone(backend: Backend, zone: str) -> None:
    clock = FakeClock(1000.0)
    queue = backend.make(workers=1, clock=clock)
    probe = Probe()
    with queue:
        job_id = queue.dispatch(ProbeJob(probe.id), run_at=aware(3600, zone))
        [(due, parked_id)] = queue.parked()
        assert parked_id == job_id
        assert 4599.0 <= due <= 4600.0
        clock.advance(3599.0)
        assert queue.pending_count() == 1
        assert probe.runs == []
        clock.advance(1.0)
        assert queue.join(WAIT)
    assert [run["id"] for run in probe.runs] == [job_id]


def test_run_at_really_waits_and_a_moment_past_runs_now(make_queue: QueueFactory) -> None:
    queue = make_queue()
    soon, past = Probe(), Probe()
    with queue:
        began = time.monotonic()
        queue.dispatch(ProbeJob(soon.id), run_at=aware(2.0, "Europe/Paris"))
        queue.dispatch(ProbeJob(past.id), run_at=aware(-3600, "UTC"))
        past.wait_finished(1)
        # Told apart by order, not by a stopwatch a loaded machine would stretch: the job due an
        # hour ago ran at once, while the other still waited for its moment.
        assert soon.runs == [], "the job due in 2 s ran before the one due an hour ago"
        assert queue.join(WAIT)
        assert soon.runs[0]["at"] - began >= 1.9


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_at": datetime.datetime(2030, 1, 1, 3, 0)}, r"run_at 2030-01-01T03:00:00 is naive; give it a time zone"),
        ({"run_at": datetime.date(2030, 1, 1)}, r"run_at must be an aware datetime, got date"),
        ({"run_at": 1893456000}, r"run_at must be an aware datetime, got int"),
        (
            {"run_at": datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc), "delay": 5},
            r"give delay or run_at, not both",
        ),
    ],
)
def test_a_bad_run_at_is_refused_naming_the_job(
    make_queue: QueueFactory, options: dict[str, Any], message: str
) -> None:
    queue = make_queue(workers=0)

    @queue.task(name="tests.scheduled")
    def scheduled() -> None:
        pass

    probe = Probe()
    with pytest.raises(syncjobs.QueueError, match=rf"job 'tests.probe': {message}"):
        queue.dispatch(ProbeJob(probe.id), **options)
    with pytest.raises(syncjobs.QueueError, match=rf"job 'tests.scheduled': {message}"):
        scheduled.using(**options).dispatch()
    assert queue.pending_count() == 0


# -- the database backend ----------------------------------------------------------


@pytest.mark.parametrize("commit", [False, True])
def test_a_task_dispatched_on_the_callers_connection_exists_with_its_transaction(
    backend: Backend, commit: bool
) -> None:
    if not backend.is_database:
        pytest.skip("a caller's transaction is the database backend's")
    queue = backend.make()
    calls = Calls()

    @queue.task(name="tests.in_tx")
    def in_tx(order: str) -> None:
        calls.add(order)

    queue.install_schema()
    conn = user_connection(backend.url or "")
    try:
        in_tx.using(connection=conn).dispatch("o-1")
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()
    assert queue.pending_count() == (1 if commit else 0)
    with queue:
        assert queue.join(WAIT)
    assert calls.seen == (["o-1"] if commit else [])
