from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import syncjobs
from syncjobs.database.dialects import Connector
from tests.dbworker import Ledger
from tests.faultproxy import FaultProxy
from tests.helpers import PROBES, FakeClock, OnceJob, ProbeJob, ThreeTimesJob, request_id

QueueFactory = Callable[..., Any]


def _django_ready() -> bool:
    try:
        import django
    except ImportError:
        return False
    return (
        django.VERSION >= (6, 0)
        and importlib.util.find_spec("pytest_django") is not None
        and os.environ.get("DJANGO_SETTINGS_MODULE") == "tests.django_project.settings"
    )


# The framework integrations' tests need their framework: `tox -e django`
# and `tox -e flask` install it (and CI runs both); elsewhere they are left out.
collect_ignore = [] if _django_ready() else ["django_project"]
if importlib.util.find_spec("flask") is None:
    collect_ignore.append("test_flask.py")

#: The servers the database tests use; this machine runs both. Override with
#: SYNCJOBS_TEST_POSTGRES / SYNCJOBS_TEST_MYSQL.
SERVER_URLS = {
    "postgresql": os.environ.get("SYNCJOBS_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    "mysql": os.environ.get("SYNCJOBS_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test"),
}
TEST_TABLE = "syncjobs_test_jobs"
BACKENDS = ["memory", "sqlite", "postgresql", "mysql"]
JOB_CLASSES = (ProbeJob, OnceJob, ThreeTimesJob)


def _reachable(name: str, url: str) -> str:
    """``url`` if its server answers; else skip (locally) or fail (under CI) with the reason."""
    try:
        conn = Connector(url).connect()
        conn.close()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means the server is not there
        reason = f"{name} is not reachable at {url}: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI must start it: see .ci/run)")
        pytest.skip(reason)
    return url


@pytest.fixture(scope="session")
def database_urls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {"sqlite": f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'jobs.db'}", **SERVER_URLS}


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def db_url(request: pytest.FixtureRequest, database_urls: dict[str, str]) -> str:
    """Each database backend's URL in turn."""
    return _reachable(request.param, database_urls[request.param])


@pytest.fixture(params=["postgresql", "mysql"])
def server_url(request: pytest.FixtureRequest) -> str:
    """Each database server's URL in turn (the backends with a network between)."""
    return _reachable(request.param, SERVER_URLS[request.param])


@pytest.fixture
def queues() -> Iterator[list[syncjobs.DatabaseJobQueue]]:
    """Database queues a test made; shut down (grace 0) after it."""
    made: list[syncjobs.DatabaseJobQueue] = []
    yield made
    for queue in made:
        queue.shutdown(grace=0)


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    """The runs of LedgerJobs (which process ran which job, when), on ``db_url``; closed after the test."""
    ledger = Ledger(db_url)
    ledger.create()
    yield ledger
    ledger.close()


@pytest.fixture
def proxy(server_url: str) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of ``server_url``; ``proxy.url(server_url)`` goes through it."""
    with FaultProxy.for_url(server_url) as proxy:
        yield proxy


class Backend:
    """Builds queues of one backend for the contract suite, and cleans them up."""

    def __init__(self, name: str, url: str | None) -> None:
        self.name = name
        self.url = url
        self.queues: list[Any] = []

    @property
    def is_database(self) -> bool:
        return self.url is not None

    def make(self, workers: int = 2, *, clock: FakeClock | None = None, **options: Any) -> Any:
        if self.url is None:
            if clock is not None:
                options["clock"] = clock
            queue: Any = syncjobs.InMemoryJobQueue(workers, **options)
            if clock is not None:
                # The timer thread sleeps on real time: after a jump of the fake
                # clock, wait until it has handed over whatever became due.
                clock.listeners.append(queue.settle_timers)
        else:
            if clock is not None:
                pytest.skip("a database queue keeps time by the database's clock, which a test cannot move")
            options.setdefault("queue", f"q-{uuid.uuid4().hex[:12]}")
            options.setdefault("carry", [request_id])
            options.setdefault("poll_interval", 0.5)
            queue = syncjobs.DatabaseJobQueue(self.url, workers=workers, table=TEST_TABLE, **options)
        for job_cls in JOB_CLASSES:
            queue.register(job_cls)
        self.queues.append(queue)
        return queue

    def close(self) -> None:
        for probe in PROBES.values():
            probe.release.set()
        for queue in self.queues:
            queue.shutdown(grace=0)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, database_urls: dict[str, str]) -> Iterator[Backend]:
    name = request.param
    url = None if name == "memory" else _reachable(name, database_urls[name])
    backend = Backend(name, url)
    yield backend
    backend.close()


@pytest.fixture
def make_queue(backend: Backend) -> QueueFactory:
    return backend.make


#: Held by the test marked ``heavy`` that runs on a server now, in any suite run on this machine.
HEAVY_LOCK = os.path.join(tempfile.gettempdir(), f"syncjobs-tests-{os.getuid()}.heavy.lock")
#: Seconds a heavy test may wait for its turn, over its own timeout (which counts its setup, where it waits):
#: the other suites' heavy tests before it, a minute or two each.
HEAVY_TURN_WAIT = 900


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("heavy") is None:
            continue
        own = item.get_closest_marker("timeout")
        seconds = float(own.args[0]) if own is not None and own.args else float(config.getini("timeout") or 60)
        item.add_marker(pytest.mark.timeout(seconds + HEAVY_TURN_WAIT), append=False)  # the closest: it wins


@pytest.fixture(autouse=True)
def _heavy_tests_take_turns(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``heavy`` on PostgreSQL or MariaDB waits for any other on this machine, whatever suite runs it.

    Its worker processes and their reconnections after faults hold many
    sessions: two at once, from suites run side by side (as CI's lanes run),
    can pass the server's ``max_connections`` (100 by default on PostgreSQL).
    Set up before the test's other fixtures, so its processes start once the
    turn is its.
    """
    callspec = getattr(request.node, "callspec", None)
    on_a_server = callspec is not None and any(value in ("postgresql", "mysql") for value in callspec.params.values())
    try:
        import fcntl
    except ImportError:  # Windows: no turns to take
        fcntl = None  # type: ignore[assignment]
    if request.node.get_closest_marker("heavy") is None or not on_a_server or fcntl is None:
        yield
        return
    with open(HEAVY_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


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
