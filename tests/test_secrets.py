"""A password in a database URL is never shown: not in output, logs, errors or ``repr()``.

Each URL carries the same password, in its user info or as ``?password=``;
the tests run commands and library calls with it (ones that connect, and ones
that fail: a scheme typo, an unreachable server, a refused password) and grep
everything they produce for it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
import uuid
from collections.abc import Iterator

import pytest

import syncjobs
from syncjobs.database.dialects import Connector
from syncjobs.urls import mask_url, redact, secrets_of
from tests.cli_jobs import Quick
from tests.conftest import SERVER_URLS
from tests.helpers import ProbeJob
from tests.test_database import drop_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "s3cretpw"


def with_password(url: str, *, in_query: bool = False) -> str:
    """``url`` with SECRET as its password: in the user info, or as ``?password=``."""
    if in_query:
        return f"{url}{'&' if '?' in url else '?'}password={SECRET}"
    scheme, _, rest = url.partition("://")
    user, at, host = rest.rpartition("@")
    return f"{scheme}://{user}:{SECRET}@{host}" if at else f"{scheme}://app:{SECRET}@{rest}"


# -- mask_url ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cretpw@db:5432/app", "postgresql://app:***@db:5432/app"),
        ("postgresq://app:s3cretpw@db/app", "postgresq://app:***@db/app"),  # a typo'd scheme too
        ("mysql://root:s3c%40retpw@[::1]:3306/x", "mysql://root:***@[::1]:3306/x"),
        (
            "postgresql://app@db/app?password=s3cretpw&sslmode=require",
            "postgresql://app@db/app?password=***&sslmode=require",
        ),
        (
            "postgresql://db/app?sslpassword=s3cretpw&PASSWORD=s3cretpw",
            "postgresql://db/app?sslpassword=***&PASSWORD=***",
        ),
        ("postgresql:app:s3cretpw@db/app", "postgresql:***@db/app"),  # no "//": user info in the path
        ("postgresql://app:s3cretpw@[::1/app", "postgresql:***"),  # unparseable: none of it
        ("postgresql://app:s3cretpw@db:port/app", "postgresql://app:***@db:port/app"),
        # Nothing secret: shown exactly as written.
        ("sqlite:////abs/jobs.db", "sqlite:////abs/jobs.db"),
        ("sqlite:///rel/jobs.db?mode=ro", "sqlite:///rel/jobs.db?mode=ro"),
        ("memory://", "memory://"),
        ("postgresql://app@db/app?application_name=a%20b", "postgresql://app@db/app?application_name=a%20b"),
    ],
)
def test_mask_url_hides_every_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert "s3c" not in mask_url(url)


def test_redact_hides_a_url_secret_a_driver_quotes_as_written_or_decoded() -> None:
    url = "postgresql://app:pa%3Ass@db/x?password=other"
    assert set(secrets_of(url)) == {"pa%3Ass", "pa:ss", "other"}
    assert redact("login pa:ss / pa%3Ass / other failed", url) == "login *** / *** / *** failed"
    assert redact("nothing to hide", None) == "nothing to hide"


# -- library calls ---------------------------------------------------------------------------


@pytest.fixture
def everything_logged() -> Iterator[list[logging.LogRecord]]:
    """Every log record of any logger, at every level, while the test runs."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root = logging.getLogger()
    handler, level = Keep(logging.DEBUG), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield records
    root.removeHandler(handler)
    root.setLevel(level)


def logged_text(records: list[logging.LogRecord]) -> str:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(record) for record in records)


def failure_text(exc: BaseException) -> str:
    """All a user may see of an exception: its message, repr and the whole chained traceback."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


FAILING_URLS = [
    pytest.param("postgresq://app:s3cretpw@127.0.0.1:5432/test", id="scheme-typo"),
    pytest.param("mysqll://root@127.0.0.1:3306/test?password=s3cretpw", id="scheme-typo-query"),
    pytest.param("postgresql://app:s3cretpw@127.0.0.1:1/test", id="postgresql-unreachable"),
    pytest.param("postgresql://app@127.0.0.1:1/test?password=s3cretpw", id="postgresql-unreachable-query"),
    pytest.param("mysql://root:s3cretpw@127.0.0.1:1/test", id="mysql-unreachable"),
    pytest.param(with_password(SERVER_URLS["mysql"]), id="mysql-wrong-password"),
]


@pytest.mark.parametrize("url", FAILING_URLS)
def test_no_error_repr_or_log_of_a_failing_url_shows_its_password(
    url: str, everything_logged: list[logging.LogRecord]
) -> None:
    seen: list[str] = []
    for attempt in (
        lambda: syncjobs.connect(url, workers=0, dispatch_timeout=0.5),
        lambda: syncjobs.from_settings({"backend": "postgresql", "url": url}),
        lambda: syncjobs.from_settings({"backend": "memory", "url": url}),
    ):
        try:
            queue = attempt()
        except syncjobs.QueueError as exc:
            seen.append(failure_text(exc))
            continue
        seen.append(repr(queue))
        queue.register(ProbeJob)
        with pytest.raises(Exception) as failed:  # noqa: PT011 - which error is item 12's; here only its text
            queue.dispatch(ProbeJob("never"))
        seen.append(failure_text(failed.value))
        queue.shutdown(grace=0)
    everything = "\n".join(seen) + logged_text(everything_logged)
    assert "***" in everything or "127.0.0.1" in everything  # the URL is still recognisable
    assert SECRET not in everything


@pytest.mark.parametrize("in_query", [False, True], ids=["userinfo", "query"])
def test_a_working_queue_never_shows_its_password(in_query: bool, everything_logged: list[logging.LogRecord]) -> None:
    url = with_password(SERVER_URLS["postgresql"], in_query=in_query)  # trust auth: the password goes unused
    queue = syncjobs.DatabaseJobQueue(url, workers=1, queue=f"q-{uuid.uuid4().hex[:8]}", table="syncjobs_secrets")
    try:
        queue.register(Quick)
        with queue:
            queue.dispatch(Quick(1))
            assert queue.join(timeout=10)
        shown = [repr(queue), repr(Connector(url)), logged_text(everything_logged)]
    finally:
        queue.shutdown(grace=0)
        drop_tables(SERVER_URLS["postgresql"], "syncjobs_secrets")
    assert "***" in shown[0]
    assert SECRET not in "\n".join(shown)


# -- the command ------------------------------------------------------------------------------


def command(*args: str) -> str:
    """Run ``syncjobs ARGS``; its stdout and stderr together."""
    result = subprocess.run(
        [sys.executable, "-m", "syncjobs", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "SYNCJOBS_URL": ""},
        timeout=90,
        check=False,
    )
    return f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"


@pytest.fixture
def table() -> Iterator[str]:
    name = f"secrets_{uuid.uuid4().hex[:10]}"
    yield name
    drop_tables(SERVER_URLS["postgresql"], name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("in_query", [False, True], ids=["userinfo", "query"])
def test_no_command_shows_the_password_of_a_working_url(in_query: bool, table: str, tmp_path: object) -> None:
    postgres = with_password(SERVER_URLS["postgresql"], in_query=in_query)
    target = ["--url", postgres, "--table", table]
    outputs = [
        command("migrate", *target),
        command("worker", *target, "--import", "tests.cli_jobs", "--max-jobs", "1", "--burst", "--log-level", "DEBUG"),
        command("stats", *target),
        command("stats", *target, "--json"),
        command("dead", "list", *target),
        command("dead", "retry", "--all", *target),
        command("demo", "--url", postgres, "--jobs", "10", "--log-level", "DEBUG"),
        command("demo", "--url", f"sqlite:///{tmp_path}/demo.db?password={SECRET}", "--jobs", "10"),
    ]
    assert outputs[1].startswith("exit 0\nsyncjobs worker ready: "), outputs[1]
    assert "***" in outputs[1].splitlines()[1]  # the readiness line shows the URL, masked
    assert all(output.startswith("exit 0\n") for output in outputs), outputs
    for output in outputs:
        assert SECRET not in output


@pytest.mark.timeout(120)
@pytest.mark.parametrize("url", FAILING_URLS)
def test_no_command_shows_the_password_of_a_failing_url(url: str) -> None:
    for args in (
        ["worker", "--url", url, "--import", "tests.cli_jobs"],
        ["worker", "--url", url, "--log-level", "DEBUG"],  # with the traceback
        ["migrate", "--url", url],
        ["stats", "--url", url],
        ["dead", "list", "--url", url],
    ):
        output = command(*args)
        assert output.startswith("exit 1\n"), output
        assert SECRET not in output
