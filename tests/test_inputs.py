"""Bad input is a ``QueueError`` (or, for a job class, a ``TypeError``) naming what was wrong, on every backend.

Never a raw driver error, and the same answer from every backend: what the
memory queue accepts, the databases store, and what one refuses, all refuse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import syncjobs
from syncjobs.database.dialects import Connector, check_identifier
from syncjobs.job import MAX_NAME_LENGTH
from tests import conftest
from tests.conftest import SERVER_URLS, QueueFactory, _reachable
from tests.helpers import WAIT, Probe, ProbeJob, request_id
from tests.test_database import drop_tables, execute


@dataclasses.dataclass
class Carrier(syncjobs.Job):
    NAME = "tests.inputs.carrier"
    value: Any = None

    def run(self) -> None:
        pass


@pytest.fixture(autouse=True, scope="module")
def _own_table() -> Iterator[None]:
    """The contract fixtures' queues on a table of this module's own.

    The servers are shared: a table another run migrated to a newer schema
    (or filled) must not decide these tests.
    """
    table = f"inputs_jobs_{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conftest, "TEST_TABLE", table)
        yield
    for url in SERVER_URLS.values():
        with contextlib.suppress(Exception):  # a server the run skipped is not there to clean
            drop_tables(url, table)


def queue_of(make_queue: QueueFactory) -> Any:
    queue = make_queue(workers=0)
    queue.register(Carrier)
    return queue


# -- lone surrogates ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("caf\udce9", "field 'value' holds a lone surrogate '\\udce9' at index 3"),
        ({"rows": [["ok", "x\ud800"]]}, "field 'value.rows[0][1]' holds a lone surrogate '\\ud800' at index 1"),
        ({"k\udfff": 1}, "the key 'k\\udfff' of field 'value' holds a lone surrogate"),
        ({"a": {"\ud83d": None}}, "the key '\\ud83d' of field 'value.a' holds a lone surrogate"),
    ],
    ids=["value", "nested-value", "key", "nested-key"],
)
def test_a_lone_surrogate_is_refused_naming_the_job_and_field_on_every_backend(
    make_queue: QueueFactory, value: Any, field: str
) -> None:
    queue = queue_of(make_queue)
    with pytest.raises(syncjobs.QueueError) as refused:
        queue.dispatch(Carrier(value))
    message = str(refused.value)
    assert message.startswith("queue error: job 'tests.inputs.carrier': payload is not valid Unicode: ")
    assert field in message
    message.encode("utf-8")  # the message itself can be printed and logged
    assert queue.pending_count() == 0


def test_a_lone_surrogate_in_a_batch_refuses_the_whole_batch(make_queue: QueueFactory) -> None:
    queue = queue_of(make_queue)
    if not hasattr(queue, "dispatch_many"):
        pytest.skip("dispatch_many is the database queue's")
    with pytest.raises(syncjobs.QueueError, match=r"field 'value\[1\]' holds a lone surrogate"):
        queue.dispatch_many([Carrier("fine"), Carrier(["ok", "\udc80"])])
    assert queue.pending_count() == 0


def test_text_that_is_valid_unicode_survives_on_every_backend(make_queue: QueueFactory) -> None:
    # The surrogate check refuses only lone ones: a real astral character, NUL
    # and control characters are JSON-escaped or UTF-8 and come back as sent.
    queue = make_queue(workers=1)
    probe = Probe()
    text = "emoji \U0001f600, NUL \x00, tab \t, é"
    token = request_id.set(text)  # a carried value too (the database queues carry request_id)
    try:
        queue.dispatch(ProbeJob(probe.id, label=0))
    finally:
        request_id.reset(token)
    queue.start()
    probe.wait_finished(1)
    assert probe.runs[0]["request_id"] == text


def test_a_carried_value_that_is_not_json_is_refused_naming_the_job(make_queue: QueueFactory) -> None:
    queue = queue_of(make_queue)
    if not hasattr(queue, "dispatch_many"):
        pytest.skip("the memory queue hands the context over as it is: nothing is carried as JSON")
    token = request_id.set({"not", "json"})  # type: ignore[arg-type]
    try:
        with pytest.raises(syncjobs.QueueError, match=r"job 'tests.inputs.carrier': carried context variables must"):
            queue.dispatch(Carrier(1))
    finally:
        request_id.reset(token)
    assert queue.pending_count() == 0


def test_a_carried_lone_surrogate_comes_back_as_it_went_on_every_backend(make_queue: QueueFactory) -> None:
    # Carried values travel as ASCII JSON (escaped), so a lone surrogate is
    # stored and comes back unchanged: the backends agree without refusing it.
    queue = make_queue(workers=1)
    probe = Probe()
    token = request_id.set("caf\udce9")
    try:
        queue.dispatch(ProbeJob(probe.id))
    finally:
        request_id.reset(token)
    queue.start()
    probe.wait_finished(1)
    assert probe.runs[0]["request_id"] == "caf\udce9"


# -- job NAMEs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("x" * (MAX_NAME_LENGTH + 1), r"NAME is 201 characters long, at most 200"),
        ("nul\x00name", r"must be printable"),
        ("line\nbreak", r"must be printable"),
        ("lone\ud800", r"must be printable"),
    ],
    ids=["too-long", "nul", "newline", "surrogate"],
)
def test_a_name_no_table_can_hold_is_refused_at_definition_and_register(
    make_queue: QueueFactory, name: str, why: str
) -> None:
    with pytest.raises(TypeError, match=rf"job class .*Defined: .*{why}"):

        class Defined(syncjobs.Job):
            NAME = name

    class Later(syncjobs.Job):  # NAME set after the class statement: caught at register()
        pass

    Later.NAME = name
    queue = make_queue(workers=0)
    with pytest.raises(TypeError, match=rf"job class .*Later: .*{why}"):
        queue.register(Later)


def test_a_name_of_the_full_column_size_runs_on_every_backend(make_queue: QueueFactory) -> None:
    name = "n" * (MAX_NAME_LENGTH - 1) + "é"  # characters, not bytes, count

    @dataclasses.dataclass
    class LongName(ProbeJob):
        NAME = name

    queue = make_queue(workers=1)
    queue.register(LongName)
    probe = Probe()
    queue.dispatch(LongName(probe.id))
    queue.start()
    probe.wait_finished(1)
    assert probe.runs[0]["name"] == name


# -- delay --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "why"),
    [
        (10**400, "an int too large"),
        (10**5000, "an int too large"),  # beyond what repr() of an int may print
        (float("inf"), "finite"),
        (-1, ">= 0"),
        (datetime.timedelta(days=-1), ">= 0"),
        ("5", "seconds or a timedelta"),
    ],
    ids=["huge-int", "enormous-int", "inf", "negative", "negative-timedelta", "text"],
)
def test_a_bad_delay_is_a_queue_error_on_every_backend(make_queue: QueueFactory, delay: Any, why: str) -> None:
    queue = queue_of(make_queue)
    with pytest.raises(syncjobs.QueueError, match=f"job 'tests.inputs.carrier': delay .*{why}"):
        queue.dispatch(Carrier(1), delay=delay)
    assert queue.pending_count() == 0


# -- table names --------------------------------------------------------------------------


@pytest.mark.parametrize("table", ["t\n", "jobs\n", "\nt", "t t", "t;", "1t", "", "t" * 64])
def test_a_table_name_that_is_not_a_plain_identifier_is_refused(table: str, tmp_path: Any) -> None:
    with pytest.raises(syncjobs.QueueError, match=r"table .* is not a valid name|is too long"):
        syncjobs.DatabaseJobQueue(f"sqlite:///{tmp_path}/jobs.db", table=table)
    with pytest.raises(syncjobs.QueueError):
        check_identifier(table, "table")


# -- the caller's connection ---------------------------------------------------------------


@pytest.fixture
def unused_table(db_url: str) -> Iterator[str]:
    table = f"inputs_{uuid.uuid4().hex[:10]}"
    yield table
    drop_tables(db_url, table)


def connection_of(kind: str, tmp_path: Any) -> Any:
    if kind == "sqlite":
        return sqlite3.connect(tmp_path / "other.db")
    return Connector(_reachable(kind, SERVER_URLS[kind])).connect()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_a_connection_of_another_database_is_refused_before_any_sql(
    db_url: str, unused_table: str, kind: str, tmp_path: Any
) -> None:
    queue = syncjobs.DatabaseJobQueue(db_url, workers=0, table=unused_table)
    queue.register(Carrier)
    dialect = Connector(db_url).dialect
    if kind == dialect.name:
        pytest.skip("the right driver: test_dispatch_joins_the_callers_transaction")
    conn = connection_of(kind, tmp_path)
    try:
        for dispatch in (
            lambda: queue.dispatch(Carrier(1), connection=conn),
            lambda: queue.dispatch_many([Carrier(1), Carrier(2)], connection=conn),
        ):
            with pytest.raises(syncjobs.QueueError) as refused:
                dispatch()
            message = str(refused.value)
            assert f"job 'tests.inputs.carrier': connection= is a {type(conn).__module__}." in message
            assert f"reaches a {kind} database" in message
            assert f"connection to the {dialect.name} database" in message
    finally:
        conn.close()
        queue.shutdown()
    # Refused before any SQL: not even the queue's own schema was created.
    assert not execute(db_url, table_exists(dialect.name), (unused_table,))


def table_exists(dialect: str) -> str:
    if dialect == "sqlite":
        return "SELECT name FROM sqlite_master WHERE name = ?"
    return "SELECT table_name FROM information_schema.tables WHERE table_name = ?"


@pytest.mark.parametrize("thing", [None.__class__, "postgresql://x", object()], ids=["a-class", "a-url", "an-object"])
def test_something_that_is_no_connection_is_refused(db_url: str, unused_table: str, thing: Any) -> None:
    queue = syncjobs.DatabaseJobQueue(db_url, workers=0, table=unused_table)
    queue.register(Carrier)
    try:
        with pytest.raises(syncjobs.QueueError, match=r"connection= must be an open .* connection to the"):
            queue.dispatch(Carrier(1), connection=thing)
    finally:
        queue.shutdown()


def test_the_right_driver_is_still_taken(db_url: str, unused_table: str) -> None:
    queue = syncjobs.DatabaseJobQueue(db_url, workers=1, table=unused_table)
    queue.register(ProbeJob)
    queue.install_schema()
    probe = Probe()
    conn = Connector(db_url).connect()
    try:
        queue.dispatch(ProbeJob(probe.id), connection=conn)  # autocommit: in at once
    finally:
        conn.close()
    with queue:
        assert queue.join(WAIT)
    assert len(probe.runs) == 1
