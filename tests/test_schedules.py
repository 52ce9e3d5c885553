"""Periodic jobs: slots across daylight saving, catch-up after a gap, one job per slot in any number of processes."""

from __future__ import annotations

import dataclasses
import datetime
import json
import signal
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

import syncjobs
from syncjobs import Schedule
from syncjobs.database.schema import SCHEMA_VERSION
from syncjobs.scheduler import MemoryRecords, Periodic, Scheduler, slot_key
from tests.conftest import QueueFactory
from tests.dbworker import Ledger, Workers
from tests.helpers import WAIT, wait_until
from tests.test_database import drop_tables, execute, install_tables, old_ddl

pytestmark = pytest.mark.timeout(120)

UTC = datetime.timezone.utc
#: Slots of Tick runs, in the order the runs began.
TICKS: list[float] = []
_TICKS_LOCK = threading.Lock()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    TICKS.clear()


def at(*fields: int) -> float:
    return datetime.datetime(*fields, tzinfo=UTC).timestamp()  # type: ignore[misc]


def shown(schedule: Schedule, slots: list[float]) -> list[str]:
    """Each slot as the schedule's wall clock shows it, and in UTC."""
    return [f"{schedule.local(s):%m-%d %H:%M %Z} = {datetime.datetime.fromtimestamp(s, UTC):%H:%MZ}" for s in slots]


@dataclasses.dataclass
class Tick(syncjobs.Job):
    NAME = "tests.schedules.tick"
    slot: float

    def run(self) -> None:
        with _TICKS_LOCK:
            TICKS.append(self.slot)


# -- the slots, on a fixed clock -------------------------------------------------------


def test_a_cron_schedule_runs_each_wall_clock_time_once_across_daylight_saving_changes() -> None:
    new_york = Schedule(cron="30 2 * * *", tz="America/New_York")
    # 8 March 2026: 02:00 EST becomes 03:00 EDT; 02:30 does not happen, and runs as if the clock had not moved.
    assert shown(new_york, list(new_york.slots(at(2026, 3, 6), at(2026, 3, 10)))) == [
        "03-06 02:30 EST = 07:30Z",
        "03-07 02:30 EST = 07:30Z",
        "03-08 03:30 EDT = 07:30Z",
        "03-09 02:30 EDT = 06:30Z",
    ]
    # 1 November 2026: 02:00 EDT becomes 01:00 EST; 01:30 happens twice, and runs at its first.
    late_night = Schedule(cron="30 1 * * *", tz="America/New_York")
    assert shown(late_night, list(late_night.slots(at(2026, 10, 31), at(2026, 11, 3)))) == [
        "10-31 01:30 EDT = 05:30Z",
        "11-01 01:30 EDT = 05:30Z",
        "11-02 01:30 EST = 06:30Z",
    ]
    # Every half hour: real half hours through the skipped hour, no slot twice.
    halves = Schedule(cron="*/30 * * * *", tz="America/New_York")
    assert shown(halves, list(halves.slots(at(2026, 3, 8, 5, 45), at(2026, 3, 8, 8, 5)))) == [
        "03-08 01:00 EST = 06:00Z",
        "03-08 01:30 EST = 06:30Z",
        "03-08 03:00 EDT = 07:00Z",
        "03-08 03:30 EDT = 07:30Z",
        "03-08 04:00 EDT = 08:00Z",
    ]
    # Europe's change is on another day and hour: 29 March 2026, 02:00 CET becomes 03:00 CEST.
    paris = Schedule(cron="0 2 * * *", tz="Europe/Paris")
    assert shown(paris, list(paris.slots(at(2026, 3, 28), at(2026, 3, 30, 12)))) == [
        "03-28 02:00 CET = 01:00Z",
        "03-29 03:00 CEST = 01:00Z",
        "03-30 02:00 CEST = 00:00Z",
    ]


def test_a_running_scheduler_dispatches_the_slot_the_clock_skips_and_one_of_the_hour_it_repeats() -> None:
    """Stepping a fixed clock through both changes in Paris, as a worker's scheduler sees them."""
    for cron, start, end, expected in (
        # 31 March 2024: 02:00 CET becomes 03:00 CEST; 02:30 runs at 03:30 CEST (01:30Z).
        ("30 2 * * *", at(2024, 3, 30, 23), at(2024, 3, 31, 3), [at(2024, 3, 31, 1, 30)]),
        # 27 October 2024: 03:00 CEST becomes 02:00 CET; 02:30 runs once, at its first (00:30Z).
        ("30 2 * * *", at(2024, 10, 26, 23), at(2024, 10, 27, 3), [at(2024, 10, 27, 0, 30)]),
    ):
        clock = _Clock(start)
        dispatched: list[float] = []
        scheduler = Scheduler(lambda periodic, slot, sink=dispatched: sink.append(slot), MemoryRecords(), clock)
        scheduler.add(Periodic("nightly", Schedule(cron=cron, tz="Europe/Paris"), lambda slot: Tick(0)))
        while clock.now < end:
            scheduler.tick()
            clock.now += 10
        assert dispatched == expected, (cron, start)


def test_a_worker_started_in_the_repeated_hour_catches_up_the_slot_of_its_first_pass() -> None:
    paris = Schedule(cron="30 2 * * *", tz="Europe/Paris")
    # 01:21Z on 27 October 2024 is 02:21 CET, the second pass: 02:30 CEST (00:30Z) is past.
    assert paris.latest(at(2024, 10, 26, 12), at(2024, 10, 27, 1, 21), 1) == [at(2024, 10, 27, 0, 30)]
    # And on the day the clock springs forward, the next slot after 03:10 CEST is that night's 03:30.
    assert paris.next_after(at(2024, 3, 31, 1, 10)) == at(2024, 3, 31, 1, 30)


def test_the_latest_slots_are_read_backwards_with_the_same_rules() -> None:
    halves = Schedule(cron="*/30 * * * *", tz="America/New_York")
    forwards = list(halves.slots(at(2026, 3, 8, 5, 45), at(2026, 3, 8, 8, 5)))
    assert halves.latest(at(2026, 3, 8, 5, 45), at(2026, 3, 8, 8, 5), 10) == forwards
    assert halves.latest(at(2026, 3, 8, 5, 45), at(2026, 3, 8, 8, 5), 2) == forwards[-2:]
    assert halves.latest(at(2026, 3, 8, 8), at(2026, 3, 8, 8, 5), 3) == []
    every = Schedule(every=300)
    assert every.latest(at(2026, 1, 1), at(2026, 1, 1, 0, 16), 2) == [at(2026, 1, 1, 0, 10), at(2026, 1, 1, 0, 15)]
    assert list(every.slots(at(2026, 1, 1), at(2026, 1, 1, 0, 11))) == [at(2026, 1, 1, 0, 5), at(2026, 1, 1, 0, 10)]
    assert every.next_after(at(2026, 1, 1, 0, 5)) == at(2026, 1, 1, 0, 10)


def test_a_schedule_that_cannot_be_is_refused_where_it_is_written() -> None:
    with pytest.raises(TypeError, match=r"give cron= \(an expression\) or every= \(seconds\), one of them"):
        Schedule()
    with pytest.raises(TypeError, match=r"give cron="):
        Schedule(cron="* * * * *", every=60)
    with pytest.raises(TypeError, match=r"cron='61 \* \* \* \*' is not a cron expression"):
        Schedule(cron="61 * * * *")
    with pytest.raises(TypeError, match=r"every= must be a whole number of seconds, at least 1, got 0.5"):
        Schedule(every=0.5)
    with pytest.raises(TypeError, match=r"every= must be a whole number of seconds, at least 1, got 2.7"):
        Schedule(every=2.7)
    with pytest.raises(TypeError, match=r"cron='0 0 30 2 \*' names no time that comes"):
        Schedule(cron="0 0 30 2 *")
    with pytest.raises(TypeError, match=r"tz='Mars/Olympus' is not a time zone name"):
        Schedule(every=60, tz="Mars/Olympus")
    with pytest.raises(TypeError, match=r"catch_up must be 'skip', 'once' or 'all', got 'some'"):
        Schedule(every=60, catch_up="some")  # type: ignore[arg-type]
    assert Schedule(every=datetime.timedelta(minutes=5)).every == 300.0
    assert Schedule(cron="0 3 * * *", tz="Europe/Paris").describe() == "cron 0 3 * * * (Europe/Paris)"


# -- the scheduler, on a fixed clock ------------------------------------------------------


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _scheduler(catch_up: Any, *, fail: set[float] | None = None) -> tuple[Scheduler, _Clock, list[float]]:
    clock = _Clock(at(2026, 6, 1, 12))
    dispatched: list[float] = []

    def dispatch(periodic: Periodic, slot: float) -> None:
        if fail and slot in fail:
            fail.discard(slot)
            raise ConnectionError("the database is down")
        dispatched.append(slot)

    scheduler = Scheduler(dispatch, MemoryRecords(), clock)
    scheduler.add(Periodic("every-minute", Schedule(every=60, catch_up=catch_up, grace=30), lambda slot: Tick(0)))
    return scheduler, clock, dispatched


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [
        ("once", [at(2026, 6, 1, 12, 54), at(2026, 6, 1, 12, 55)]),  # the latest missed, then the one on time
        ("skip", [at(2026, 6, 1, 12, 55)]),
        ("all", [at(2026, 6, 1, 12, m) for m in range(1, 56)]),
    ],
)
def test_slots_missed_while_no_worker_was_up_run_once_by_default_or_as_configured(
    catch_up: str, expected: list[float]
) -> None:
    scheduler, clock, dispatched = _scheduler(catch_up)
    assert scheduler.tick() == 60.0  # a schedule never run before starts now: its first slot is the next
    assert dispatched == []
    clock.now = at(2026, 6, 1, 12, 55, 10)  # 54 slots passed with no tick; 12:55 is within the grace
    pause = scheduler.tick()
    assert dispatched == expected
    assert pause == pytest.approx(50.0)
    clock.now = at(2026, 6, 1, 12, 56, 1)
    scheduler.tick()
    assert dispatched[-1] == at(2026, 6, 1, 12, 56)


def test_a_slot_whose_dispatch_failed_is_dispatched_at_the_next_tick(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, clock, dispatched = _scheduler("once", fail={at(2026, 6, 1, 12, 1)})
    scheduler.tick()
    clock.now = at(2026, 6, 1, 12, 1, 1)
    assert scheduler.tick() == 1.0  # the database was down: tried again in a second
    assert dispatched == []
    assert "schedule 'every-minute': a slot could not be dispatched" in caplog.text
    clock.now = at(2026, 6, 1, 12, 1, 2)
    scheduler.tick()
    assert dispatched == [at(2026, 6, 1, 12, 1)]
    caplog.clear()  # the failure was the point


def test_a_slot_key_is_one_per_queue_schedule_and_slot() -> None:
    keys = {slot_key(q, n, s).digest for q in ("a", "b") for n in ("x", "y") for s in (1.0, 2.0)}
    assert len(keys) == 8
    assert slot_key("a", "x", 1.0) == slot_key("a", "x", 1.0)


# -- the contract, on every backend ----------------------------------------------------------


def test_a_schedule_dispatches_one_job_per_slot_while_the_queue_runs(make_queue: QueueFactory) -> None:
    queue = make_queue(1)
    queue.register(Tick)
    queue.schedule("tests.every-second", lambda slot: Tick(slot.timestamp()), every=1)
    with pytest.raises(syncjobs.QueueError, match=r"schedule 'tests.every-second' is already defined"):
        queue.schedule("tests.every-second", Tick(0), every=5)
    queue.start()
    wait_until(lambda: len(TICKS) >= 3, what="3 slots")
    queue.shutdown()
    ticks = sorted(TICKS)
    assert len(set(ticks)) == len(ticks)  # one job per slot
    assert ticks == [ticks[0] + n for n in range(len(ticks))]  # every slot, each second
    [state] = queue.schedules()
    assert state.name == "tests.every-second"
    assert state.description == "every 1s"
    assert state.last is not None
    assert state.next is not None
    assert state.last.timestamp() == ticks[-1]
    assert state.next.timestamp() == ticks[-1] + 1


def test_a_task_runs_on_its_schedule_with_no_arguments(make_queue: QueueFactory) -> None:
    queue = make_queue(1)
    ran = threading.Event()

    @queue.task(name="tests.schedules.beat", schedule=Schedule(every=1))
    def beat() -> None:
        ran.set()

    with pytest.raises(TypeError, match=r"a scheduled task is called with no arguments, and needy\(\) needs some"):

        @queue.task(name="tests.schedules.needy", schedule=Schedule(every=1))
        def needy(user_id: int) -> None:
            pass

    queue.start()
    assert ran.wait(WAIT)


def test_a_schedule_whose_job_cannot_be_dispatched_stops_start_naming_it(make_queue: QueueFactory) -> None:
    queue = make_queue(1)  # Tick not registered
    queue.schedule("tests.unregistered", Tick(0), every=60)
    with pytest.raises(syncjobs.QueueError, match=r"schedule 'tests.unregistered': job 'tests.schedules.tick' .*"):
        queue.start()
    with pytest.raises(syncjobs.QueueError, match=r"a schedule's name must be 1 to 200 printable characters"):
        queue.schedule("", Tick(0), every=60)
    with pytest.raises(TypeError, match=r"job must be a syncjobs.Job or a function of the slot"):
        queue.schedule("tests.bad", "Tick", every=60)


# -- many processes on one database --------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.timeout(240)
def test_four_processes_and_one_killed_midway_run_each_slot_of_a_one_second_schedule_once(db_url: str) -> None:
    name = f"q-{uuid.uuid4().hex[:10]}"
    table = f"t_{uuid.uuid4().hex[:10]}"
    ledger = Ledger(db_url)
    ledger.create()
    # A short lease: a job claimed by the process killed runs again in a second or two.
    workers = Workers(db_url, name, table=table, workers=2, lease=2.0, schedule_every=1)
    try:
        processes = [workers.spawn() for _ in range(4)]
        began = time.time()
        wait_until(lambda: time.time() >= began + 30, timeout=40, what="30 s of slots")
        victim = processes[1]
        victim.send_signal(signal.SIGKILL)
        victim.wait(WAIT)
        workers.spawn()  # its replacement, midway
        wait_until(lambda: time.time() >= began + 60, timeout=40, what="60 s of slots")
        ended = time.time()
        # The last slots' jobs finish.
        wait_until(
            lambda: {n for n, _, _ in ledger.runs(name)} >= set(range(int(began) + 1, int(ended))),
            what="the last slots' runs",
        )
    finally:
        workers.stop()
    runs = ledger.details(name)
    slots = range(int(began) + 1, int(ended))  # every whole second of the run
    # A second job for a slot would have a first run of its own; a run the kill cut short may be
    # followed by its job's next attempt (or, if it never began, by another first run of it).
    ran = Counter(run.n for run in runs if run.ended is not None)
    first_runs = Counter(run.n for run in runs if run.attempt == 0 and run.pid != victim.pid)
    assert [slot for slot in slots if not ran[slot]] == []  # none missing
    assert [slot for slot in slots if first_runs[slot] > 1] == []  # one job per slot
    assert all(run.ended is not None for run in runs if run.pid != victim.pid)
    assert len({run.pid for run in runs}) >= 3  # not one process doing it all
    recorded = execute(db_url, f"SELECT name, last_slot FROM {table}_schedules WHERE queue = ?", (name,))
    assert [(n, int(last) >= slots[-1]) for n, last in recorded] == [("tests.tick", True)]
    drop_tables(db_url, table)
    ledger.close()


# -- the table: listed by the CLI, upgraded in place --------------------------------------


def test_the_schedules_command_lists_each_schedule_with_its_last_and_next_run(db_url: str) -> None:
    from tests.test_cli import run

    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, workers=1, table=table, queue="reports", poll_interval=0.2)
    queue.register(Tick)
    queue.schedule("tests.nightly", Tick(0), cron="0 3 * * *", tz="Europe/Paris", catch_up="skip")
    queue.schedule("tests.often", lambda slot: Tick(slot.timestamp()), every=1)
    try:
        queue.install_schema()
        code, out, err = run("schedules", "--url", db_url, "--table", table)
        assert (code, out) == (
            0,
            "no schedules: a queue's schedules are listed once a worker of the queue has started\n",
        ), err
        with queue:
            wait_until(lambda: len(TICKS) >= 1, what="a slot")
        code, out, err = run("schedules", "--url", db_url, "--table", table)
        assert code == 0, err
        [header, nightly, often] = out.splitlines()
        assert header.split() == ["QUEUE", "SCHEDULE", "WHEN", "LAST", "RUN", "NEXT", "RUN"]
        # Listed as soon as a worker started, before its first slot.
        assert nightly.split()[:7] == ["reports", "tests.nightly", "cron", "0", "3", "*", "*"]
        assert " never " in nightly
        assert often.split()[:4] == ["reports", "tests.often", "every", "1s"]
        code, out, err = run("schedules", "--url", db_url, "--table", table, "--json")
        rows = {row["name"]: row for row in json.loads(out)}
        assert rows["tests.nightly"]["last_slot"] is None
        assert rows["tests.often"]["next_slot"] == rows["tests.often"]["last_slot"] + 1
        code, out, err = run("stats", "--url", db_url, "--table", table)
        assert "2 schedule(s)" in out
        assert "tests.often" in out
        # The nightly one is listed by the queue itself, with its next 03:00 in Paris.
        states = {state.name: state for state in queue.schedules()}
        assert states["tests.nightly"].last is None
        following = states["tests.nightly"].next
        assert following is not None
        assert following.astimezone(Schedule(every=1, tz="Europe/Paris").local(0).tzinfo).hour == 3
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)


def test_a_populated_version_7_table_gains_the_schedules_table_in_place(db_url: str) -> None:
    table = f"t_{uuid.uuid4().hex[:10]}"
    queue = syncjobs.DatabaseJobQueue(db_url, table=table, auto_schema=False, workers=1, poll_interval=0.2)
    queue.register(Tick)
    queue.schedule("tests.every-second", lambda slot: Tick(slot.timestamp()), every=1)
    try:
        for statement in old_ddl(db_url, table, 7):
            execute(db_url, statement)
        execute(db_url, f"INSERT INTO {table}_schema (version) VALUES (7)")
        execute(
            db_url,
            f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at) "
            "VALUES (?, 'default', 'tests.schedules.tick', '{\"slot\": -1}', 'queued', 0, 3, 0, 0)",
            (str(uuid.uuid4()),),
        )
        with pytest.raises(syncjobs.QueueError, match=rf"version 7, this syncjobs needs {SCHEMA_VERSION}"):
            queue.start()
        planned = queue.admin.ddl()  # what `syncjobs migrate --sql` prints
        assert [s for s in planned if s.startswith(f"CREATE TABLE IF NOT EXISTS {table}_schedules")]
        assert queue.admin.migrate() == 7
        queue.start()
        wait_until(lambda: -1 in TICKS and len(TICKS) >= 2, what="the queued job and a slot")
    finally:
        queue.shutdown(grace=0)
        drop_tables(db_url, table)


def test_the_longest_table_name_fits_its_longest_companion_on_every_database(db_url: str) -> None:
    # 54 characters ("<table>_schedules" is 64), and on MySQL 48 ("<table>_results_expires", an index, is 64).
    longest = 48 if db_url.startswith("mysql") else 54
    table = "syncjobs_long_" + "s" * (longest - 14)
    try:
        install_tables(db_url, table)
        execute(db_url, f"SELECT COUNT(*) FROM {table}_schedules")
    finally:
        drop_tables(db_url, table)
    with pytest.raises(syncjobs.QueueError, match=rf"too long: at most {longest} characters"):
        syncjobs.DatabaseJobQueue(db_url, table=table + "s")
