"""The ``syncjobs`` command, run as real subprocesses against SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import datetime
import json
import os
import queue as stdqueue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import syncjobs
from syncjobs.database.dialects import dialect_for
from syncjobs.database.schema import SCHEMA_VERSION
from tests.cli_jobs import Quick, Sleepy, Stubborn, shout
from tests.helpers import WAIT, popen_interruptible
from tests.test_database import drop_tables, execute

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    name = f"cli_{uuid.uuid4().hex[:10]}"
    yield name
    drop_tables(db_url, name)


class Command:
    """A ``syncjobs`` subprocess whose output lines are read as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, stdin: Any = subprocess.DEVNULL) -> None:
        # stdin is never the test run's own: a command that asks on a terminal would wait for an answer.
        self.proc = popen_interruptible(
            [sys.executable, "-m", "syncjobs", *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
        )
        self.lines: stdqueue.Queue[tuple[str, str]] = stdqueue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, "out", self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, "err", self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any, name: str, into: list[str]) -> None:
        for line in stream:
            into.append(line)
            self.lines.put((name, line))

    def expect(self, pattern: str, timeout: float = WAIT) -> str:
        """The next line (of either stream) matching ``pattern``; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                _, line = self.lines.get(timeout=max(0.0, remaining))
            except stdqueue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} within {timeout}s; stdout: {self.out!r}; stderr: {self.err!r}"
                ) from None
            if re.search(pattern, line):
                return line

    def wait(self, timeout: float = WAIT) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        for reader in self._readers:
            reader.join(timeout=WAIT)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, str, str]:
    command = Command(*args, env=env)
    code = command.wait(timeout)
    return code, "".join(command.out), "".join(command.err)


def dispatch(url: str, table: str, *jobs: syncjobs.Job, queue: str = "default", delay: float = 0) -> list[str]:
    """Dispatch from a queue of no workers, as a web process does; the jobs' ids."""
    producer = syncjobs.DatabaseJobQueue(url, workers=0, table=table, queue=queue)
    for job_cls in (Quick, Sleepy, Stubborn, shout.job_class):
        producer.register(job_cls)
    try:
        return producer.dispatch_many(list(jobs), delay=delay)
    finally:
        producer.shutdown()


def assert_times(fields: dict[str, Any], *names: str) -> None:
    """``--json`` output gives each time twice: ``<name>_at`` in ISO-8601 UTC, ``<name>_at_epoch`` in Unix seconds."""
    for name in names:
        iso, epoch = fields[f"{name}_at"], fields[f"{name}_at_epoch"]
        assert iso.endswith("+00:00"), iso
        assert datetime.datetime.fromisoformat(iso).timestamp() == pytest.approx(epoch, abs=0.001)


def rows(url: str, table: str) -> list[tuple[Any, ...]]:
    return execute(url, f"SELECT name, state, attempt FROM {table} ORDER BY created_at")


@pytest.fixture
def started() -> Iterator[list[Command]]:
    commands: list[Command] = []
    yield commands
    for command in commands:
        command.kill()


def worker(started: list[Command], url: str, table: str, *options: str) -> Command:
    command = Command("worker", "--url", url, "--table", table, "--import", "tests.cli_jobs", *options)
    started.append(command)
    command.expect(r"^syncjobs worker ready: pid \d+")
    return command


# -- worker -----------------------------------------------------------------------


def test_a_worker_runs_jobs_logs_each_outcome_and_exits_in_burst_mode(db_url: str, table: str) -> None:
    ids = dispatch(db_url, table, *(Quick(n) for n in range(5)), Quick(-1))
    [later] = dispatch(db_url, table, Quick(99), delay=3600)
    code, out, err = run("worker", "--url", db_url, "--table", table, "--import", "tests.cli_jobs", "--burst")
    assert code == 0, err
    assert out.startswith("syncjobs worker ready: pid ")
    for job_id in ids[:5]:
        assert re.search(rf"job cli\.quick \({job_id}\) run 1 of 5 in [\d.]+ms: done", err), err
    assert re.search(rf"job cli\.quick \({ids[5]}\) run 1 of 5 in [\d.]+ms: dead: fatal: negative n -1", err)
    assert "burst reached: stopping" in err
    assert "Traceback" not in err
    assert '"n"' not in err  # payloads are never logged
    # The delayed job waits for its time; the burst did not wait for it.
    assert rows(db_url, table) == [("cli.quick", "dead", 1), ("cli.quick", "queued", 0)]
    assert execute(db_url, f"SELECT id FROM {table} WHERE state = 'queued'") == [(later,)]


def test_a_worker_runs_the_function_tasks_of_the_modules_it_imports(db_url: str, table: str) -> None:
    loud, empty = dispatch(db_url, table, shout.job_class(["hey"], {"times": 2}), shout.job_class([""], {}))
    code, out, err = run("worker", "--url", db_url, "--table", table, "--import", "tests.cli_jobs", "--burst")
    assert code == 0, err
    assert re.search(r"^shout heyhey pid \d+$", out, re.MULTILINE), out
    assert re.search(rf"job cli\.shout \({loud}\) run 1 of 1 in [\d.]+ms: done", err), err
    assert re.search(rf"job cli\.shout \({empty}\) run 1 of 1 in [\d.]+ms: dead: job raised ValueError", err), err
    # Its result, read by another process.
    code, out, err = run("show", loud, "--url", db_url, "--table", table)
    assert code == 0, err
    assert "state:        done" in out
    assert 'result:       "heyhey"' in out
    assert 'payload:      {"args": ["hey"], "kwargs": {"times": 2}}' in out
    code, out, err = run("show", empty, "--url", db_url, "--table", table, "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["state"], shown["attempts"], shown["error"]) == ("dead", 1, "job raised ValueError: nothing to shout")
    assert shown["traceback"].startswith("Traceback (most recent call last):\n")
    assert shown["traceback"].rstrip().endswith("ValueError: nothing to shout")
    code, out, err = run("show", empty, "--url", db_url, "--table", table)
    assert code == 0, err
    # Where it raised, last, its lines indented (as `dead show` indents the payload's).
    assert "error:        job raised ValueError: nothing to shout\n" in out
    assert "\ntraceback:\n  Traceback (most recent call last):\n" in out
    assert '      raise ValueError("nothing to shout")\n' in out
    assert out.endswith("  ValueError: nothing to shout\n")
    assert (shown["queue"], shown["payload"]) == ("default", {"args": [""], "kwargs": {}})
    assert_times(shown, "created", "started", "finished")
    assert (shown["due_at"], shown["due_at_epoch"]) == (None, None)
    assert rows(db_url, table) == [("cli.shout", "dead", 1)]


def test_show_and_cancel_a_waiting_and_a_running_job(db_url: str, table: str) -> None:
    ids = seed(db_url, table)
    base = ("--url", db_url, "--table", table)
    code, out, err = run("show", ids["later"], *base)
    assert code == 0, err
    assert "state:        retrying" in out
    assert "attempts:     1" in out
    assert "due:" in out
    code, out, _ = run("cancel", ids["later"], ids["running"], "no-such-id", *base)
    assert code == 1
    assert out.splitlines() == [
        f"{ids['later']}: cancelled",
        f"{ids['running']}: running; its worker cancels it at its next heartbeat",
        "no-such-id: no such unfinished job",
    ]
    code, out, _ = run("show", ids["later"], *base, "--json")
    assert json.loads(out)["state"] == "cancelled"
    assert execute(db_url, f"SELECT cancel_requested FROM {table} WHERE id = '{ids['running']}'") == [(1,)]
    code, out, err = run("show", "no-such-id", *base)
    assert code == 1
    assert "no job with id 'no-such-id'" in err


def test_timeout_fails_a_run_that_takes_too_long_and_the_worker_exits_without_its_thread(
    db_url: str, table: str
) -> None:
    [job_id] = dispatch(db_url, table, Stubborn(60))  # it ignores its cancel token
    began = time.monotonic()
    code, out, err = run(
        "worker", "--url", db_url, "--table", table, "--import", "tests.cli_jobs", "--burst", "--timeout", "0.5"
    )
    assert code == 0, err
    assert time.monotonic() - began < 30
    assert f"started stubborn {job_id} attempt 0" in out
    assert f"job cli.stubborn ({job_id}) timed out after 0.5s: cancelled" in err
    assert re.search(rf"job cli\.stubborn \({job_id}\) run 1 of 5 in [\d.]+ms: failed, retry in 1s: timed out", err)
    assert rows(db_url, table) == [("cli.stubborn", "queued", 1)]  # its retry waits for the next worker
    code, _, err = run("worker", "--url", db_url, "--table", table, "--timeout", "0")
    assert (code, err.strip()) == (
        1,
        "syncjobs worker: error: timeout must be a number of seconds > 0 (or None), got 0.0",
    )


def test_json_logs_carry_the_job_fields(db_url: str, table: str) -> None:
    [job_id] = dispatch(db_url, table, Quick(1))
    code, _, err = run(
        "worker", "--url", db_url, "--table", table, "--import", "tests.cli_jobs", "--burst", "--log-format", "json"
    )
    assert code == 0, err
    entries = [json.loads(line) for line in err.splitlines()]
    outcomes = [e for e in entries if e.get("job_id") == job_id and e["logger"] == "syncjobs.worker"]
    assert len(outcomes) == 1, err
    done = outcomes[0]
    assert done["outcome"] == "done"
    assert done["job_name"] == "cli.quick"
    assert done["attempt"] == 1
    assert done["level"] == "INFO"
    assert done["duration"] >= 0


@pytest.mark.timeout(60)
def test_a_job_handed_back_for_a_worker_that_knows_it_is_one_log_line(db_url: str, table: str) -> None:
    [job_id] = dispatch(db_url, table, Quick(1))
    # No --import: this worker knows no class, as an old release's meeting a new job.
    code, _, err = run("worker", "--url", db_url, "--table", table, "--burst", "--log-format", "json")
    assert code == 0, err
    entries = [json.loads(line) for line in err.splitlines()]
    [line] = [e for e in entries if e.get("job_id") == job_id]  # nothing ran: no run line beside it
    assert line["outcome"] == "deferred"
    assert line["attempt"] == 1
    assert "no job class is registered as 'cli.quick' here; handed back unrun" in line["message"]
    [warning] = [e["message"] for e in entries if e["level"] == "WARNING"]
    assert warning.startswith("no job classes are registered: this worker runs no job")
    assert rows(db_url, table) == [("cli.quick", "queued", 0)]


def test_sigterm_mid_job_hands_it_back_within_the_grace(db_url: str, table: str, started: list[Command]) -> None:
    command = worker(started, db_url, table, "--grace", "1", "--workers", "2")
    [job_id] = dispatch(db_url, table, Sleepy(120))
    command.expect(rf"^started sleepy {job_id} attempt 0")
    # While it runs, stats (finding the database through $SYNCJOBS_URL) shows it.
    code, out, err = run("stats", "--table", table, "--json", env={"SYNCJOBS_URL": db_url})
    assert code == 0, err
    stats = json.loads(out)
    assert [(q["queue"], q["running"]) for q in stats["queues"]] == [("default", 1)]
    assert [(w["pid"], w["threads"]) for w in stats["workers"]] == [(command.proc.pid, 2)]
    began = time.monotonic()
    command.proc.send_signal(signal.SIGTERM)
    assert command.wait() == 0
    assert time.monotonic() - began < 1 + WAIT / 2  # the grace, plus a process's exit
    err = "".join(command.err)
    assert "SIGTERM: stopping; running jobs get 1s" in err
    assert re.search(rf"job cli\.sleepy \({job_id}\) run 1 of 5 in [\d.]+ms: aborted: handed back at shutdown", err)
    assert rows(db_url, table) == [("cli.sleepy", "queued", 1)]  # back in the queue, its run spent


def test_a_second_sigterm_hands_back_at_once(db_url: str, table: str, started: list[Command]) -> None:
    command = worker(started, db_url, table, "--grace", "300")
    [job_id] = dispatch(db_url, table, Sleepy(300))
    command.expect(rf"^started sleepy {job_id}")
    command.proc.send_signal(signal.SIGTERM)
    command.expect(r"SIGTERM: stopping; running jobs get 300s")
    began = time.monotonic()
    command.proc.send_signal(signal.SIGTERM)
    assert command.wait() == 128 + signal.SIGTERM
    assert time.monotonic() - began < WAIT  # not the 300 s grace
    assert "SIGTERM again: handing running jobs back now" in "".join(command.err)
    assert rows(db_url, table) == [("cli.sleepy", "queued", 1)]


def test_a_job_that_ignores_cancellation_does_not_keep_the_worker_alive(tmp_path: Any, started: list[Command]) -> None:
    url, table = f"sqlite:///{tmp_path / 'jobs.db'}", "stubborn_jobs"
    command = worker(started, url, table, "--grace", "0.5")
    [job_id] = dispatch(url, table, Stubborn(300))
    command.expect(rf"^started stubborn {job_id}")
    began = time.monotonic()
    command.proc.send_signal(signal.SIGTERM)
    assert command.wait() == 0
    assert time.monotonic() - began < WAIT  # not the job's 300 s
    assert "1 job(s) ignored cancellation; exiting without them" in "".join(command.err)
    assert rows(url, table) == [("cli.stubborn", "queued", 1)]  # handed back all the same


def test_max_jobs_stops_after_that_many_runs(db_url: str, table: str) -> None:
    dispatch(db_url, table, *(Quick(n) for n in range(10)))
    code, _, err = run(
        "worker", "--url", db_url, "--table", table, "--import", "tests.cli_jobs", "--workers", "1", "--max-jobs", "3"
    )
    assert code == 0, err
    assert "max-jobs reached: stopping" in err
    # One worker thread: it stops claiming as its third run ends.
    assert err.count(": done") == 3, err
    assert len(rows(db_url, table)) == 7


def test_an_app_path_names_the_queue_and_its_jobs(db_url: str, table: str, tmp_path: Any) -> None:
    (tmp_path / "myapp.py").write_text(
        "import os, syncjobs\n"
        "from tests.cli_jobs import Quick\n"
        "def make_queue():\n"
        "    queue = syncjobs.DatabaseJobQueue(os.environ['APP_URL'], table=os.environ['APP_TABLE'], workers=3)\n"
        "    queue.register(Quick)\n"
        "    return queue\n"
    )
    dispatch(db_url, table, Quick(7), queue="mail")
    env = {"APP_URL": db_url, "APP_TABLE": table, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    code, out, err = run("worker", "myapp:make_queue", "--queue", "mail", "--burst", env=env)
    assert code == 0, err
    assert "3 thread(s) on queue(s) 'mail'" in out
    assert ": done" in err
    assert rows(db_url, table) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "nosql://x"], r"no database backend for the URL 'nosql://x'"),
        (["--url", "memory://"], r"memory:// holds jobs inside one process"),
        (["--url", "sqlite:////no/such/dir/x.db", "--import", "no_such_module_here"], r"cannot import 'no_such_"),
        (["--url", "sqlite:////no/such/dir/x.db"], r"cannot reach the sqlite database at sqlite:////no/such/dir/x.db"),
        (["--url", "postgresql://nobody@127.0.0.1:1/x"], r"cannot reach the postgresql database at postgresql://"),
        (["--url", "mysql://root:secret@127.0.0.1:1/x"], r"cannot reach the mysql database at mysql://root:\*\*\*@"),
        (["tests.cli_jobs:nothing"], r"module 'tests.cli_jobs' has no attribute 'nothing'"),
        ([], r"no queue given: pass --url URL \(or set SYNCJOBS_URL\)"),
    ],
)
def test_a_startup_error_is_one_clear_line(args: list[str], message: str) -> None:
    code, out, err = run("worker", *args, env={"SYNCJOBS_URL": ""})
    assert code == 1
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("syncjobs worker: error: ")
    assert re.search(message, lines[0]), lines[0]
    assert "secret" not in err


def test_debug_shows_the_traceback_of_a_startup_error() -> None:
    code, _, err = run("worker", "--url", "postgresql://nobody@127.0.0.1:1/x", "--log-level", "DEBUG")
    assert code == 1
    assert "Traceback" in err
    assert err.rstrip().splitlines()[-1].startswith("syncjobs worker: error: cannot reach")


# -- migrate ------------------------------------------------------------------------


def test_migrate_creates_then_finds_nothing_to_do_and_prints_its_sql(db_url: str, table: str) -> None:
    code, out, err = run("migrate", "--url", db_url, "--table", table)
    assert (code, out) == (0, f"table {table}: created, schema version {SCHEMA_VERSION}\n"), err
    code, out, err = run("migrate", "--url", db_url, "--table", table)
    assert (code, out) == (0, f"table {table}: already at schema version {SCHEMA_VERSION}, nothing to do\n"), err
    assert execute(db_url, f"SELECT version FROM {table}_schema") == [(SCHEMA_VERSION,)]
    code, out, _ = run("migrate", "--url", db_url, "--table", table, "--sql")
    assert code == 0
    statements = [s.strip() for s in out.split(";\n") if s.strip()]
    assert statements[0].startswith(f"CREATE TABLE IF NOT EXISTS {table} (")
    assert any(s.startswith(f"CREATE TABLE IF NOT EXISTS {table}_workers") for s in statements)
    assert statements[-1] == f"INSERT INTO {table}_schema (version) VALUES ({SCHEMA_VERSION})"


def test_migrate_sql_runs_as_printed(db_url: str, table: str) -> None:
    _, out, _ = run("migrate", "--url", db_url, "--table", table, "--sql")
    for statement in out.split(";\n"):
        if statement.strip():
            execute(db_url, statement)
    code, out, _ = run("migrate", "--url", db_url, "--table", table)
    assert (code, out) == (0, f"table {table}: already at schema version {SCHEMA_VERSION}, nothing to do\n")


# -- stats and dead letters on a seeded table ------------------------------------------


def seed(url: str, table: str) -> dict[str, str]:
    """Rows in every state, a done count and a live worker, written as SQL."""
    admin = syncjobs.DatabaseJobQueue(url, table=table, workers=0).admin
    admin.migrate()
    admin.close()
    now = dialect_for(url).now
    mark = dialect_for(url).placeholder
    ids = {key: f"{key}-{uuid.uuid4().hex[:8]}" for key in ("ready", "ready2", "later", "running", "dead", "old_dead")}
    insert = (
        f"INSERT INTO {table} (id, queue, name, payload, state, attempt, max_attempts, run_at, created_at, "
        f"error, finished_at) VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark}, 5, {now} + {mark}, {now}, "
        f"{mark}, {now} - {mark})"
    )
    for key, queue, state, attempt, run_in, error, died in [
        ("ready", "default", "queued", 0, -30.0, None, None),
        ("ready2", "default", "queued", 0, -5.0, None, None),
        ("later", "default", "queued", 1, 600.0, None, None),
        ("running", "mail", "running", 0, 0.0, None, None),
        ("dead", "mail", "dead", 5, 0.0, "job raised ValueError: bad address", 60.0),
        ("old_dead", "default", "dead", 1, 0.0, "fatal: card declined", 7200.0),
    ]:
        execute(
            url,
            insert.replace(f"{now} - {mark})", "NULL)") if died is None else insert,
            (ids[key], queue, "cli.quick", json.dumps({"n": len(key)}), state, attempt, run_in, error)
            + (() if died is None else (died,)),
        )
    execute(url, f"INSERT INTO {table}_done (queue, bucket, done) VALUES ('default', {mark}, 7)", (int(time.time()),))
    execute(
        url,
        f"INSERT INTO {table}_done (queue, bucket, done) VALUES ('default', {mark}, 100)",
        (int(time.time()) - 120,),
    )
    execute(
        url,
        f"INSERT INTO {table}_workers (id, queue, host, pid, threads, lease, started_at, heartbeat_at) "
        f"VALUES ('w1', 'mail', 'box', 4242, 8, 30, {now} - 300, {now} - 2)",
    )
    execute(
        url,
        f"INSERT INTO {table}_workers (id, queue, host, pid, threads, lease, started_at, heartbeat_at) "
        f"VALUES ('w0', 'mail', 'gone', 1, 8, 30, {now} - 900, {now} - 600)",
    )
    return ids


def test_stats_counts_by_queue_and_state_with_the_live_workers(db_url: str, table: str) -> None:
    seed(db_url, table)
    code, out, err = run("stats", "--url", db_url, "--table", table, "--json")
    assert code == 0, err
    stats = json.loads(out)
    default, mail = stats["queues"]
    assert default["oldest_queued_age"] == pytest.approx(30, abs=10)
    assert {k: v for k, v in default.items() if k != "oldest_queued_age"} == {
        "queue": "default",
        "queued": 2,
        "running": 0,
        "parked": 1,
        "dead": 1,
        "done_last_minute": 7,
    }
    assert mail == {
        "queue": "mail",
        "queued": 0,
        "running": 1,
        "parked": 0,
        "dead": 1,
        "oldest_queued_age": None,
        "done_last_minute": 0,
    }
    [live] = stats["workers"]  # the one whose heartbeat stopped ten minutes ago is not live
    assert (live["host"], live["pid"], live["queue"], live["threads"]) == ("box", 4242, "mail", 8)
    assert live["heartbeat_age"] == pytest.approx(2, abs=5)

    code, out, _ = run("stats", "--url", db_url, "--table", table)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "QUEUED",
        "RUNNING",
        "PARKED",
        "DEAD",
        "OLDEST",
        "QUEUED",
        "DONE",
        "LAST",
        "MIN",
    ]
    assert lines[1].split()[:5] == ["default", "2", "0", "1", "1"]
    assert lines[1].split()[-1] == "7"
    assert lines[2].split() == ["mail", "0", "1", "0", "1", "-", "0"]
    assert "1 live worker(s)" in out
    assert re.search(r"box\s+4242\s+mail\s+8\s+5m0\ds\s+[\d.]+s ago", out), out


def test_stats_says_when_a_running_job_has_no_live_worker(db_url: str, table: str) -> None:
    seed(db_url, table)
    code, out, _ = run("stats", "--url", db_url, "--table", table)
    assert code == 0
    assert "no live worker" not in out  # w1 serves 'mail', where the job runs
    execute(db_url, f"DELETE FROM {table}_workers")
    code, out, _ = run("stats", "--url", db_url, "--table", table)
    assert code == 0
    assert "0 live worker(s)" in out
    assert out.endswith(
        "queue 'mail': 1 running with no live worker: the worker that took it stopped or died, "
        "and a worker of the queue takes it back once the lease expires\n"
    )


def test_stats_watch_refreshes_until_interrupted(db_url: str, table: str) -> None:
    seed(db_url, table)
    command = Command("stats", "--url", db_url, "--table", table, "--watch", "0.1")
    try:
        for _ in range(2):
            command.expect(r"^-- \d{4}-\d\d-\d\d ")  # one header per refresh
            command.expect(r"^default\s+2\s+0\s+1\s+1")
        command.proc.send_signal(signal.SIGINT)
        assert command.wait() == 0
    finally:
        command.kill()


def test_dead_list_show_retry_and_purge(db_url: str, table: str) -> None:
    ids = seed(db_url, table)
    base = ("--url", db_url, "--table", table)
    code, out, err = run("dead", "list", *base)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "QUEUE", "NAME", "ATTEMPTS", "DIED", "ERROR"]
    # Oldest first.
    assert lines[1].split()[:4] == [ids["old_dead"], "default", "cli.quick", "1"]
    assert lines[1].endswith("fatal: card declined")
    assert lines[2].split()[:4] == [ids["dead"], "mail", "cli.quick", "5"]
    assert lines[2].endswith("job raised ValueError: bad address")

    _, out, _ = run("dead", "list", *base, "--queue", "mail", "--json")
    [entry] = [json.loads(line) for line in out.splitlines()]
    assert (entry["id"], entry["attempts"], entry["error"]) == (ids["dead"], 5, "job raised ValueError: bad address")
    assert "payload" not in entry
    assert_times(entry, "created", "died")
    assert abs(time.time() - 60 - entry["died_at_epoch"]) < 30  # seeded as dead a minute ago

    code, out, _ = run("dead", "show", ids["dead"], *base)
    assert code == 0
    assert f"id:           {ids['dead']}" in out
    assert "error:        job raised ValueError: bad address" in out
    assert 'payload:\n  {\n    "n": 4\n  }' in out
    code, _, err = run("dead", "show", ids["ready"], *base)  # not a dead letter
    assert code == 1
    assert f"no dead letter with id {ids['ready']!r}" in err

    code, out, _ = run("dead", "retry", ids["dead"], "no-such-id", *base)
    assert code == 1
    assert out.splitlines() == [f"{ids['dead']}: queued again", "no-such-id: no such dead letter"]
    assert execute(db_url, f"SELECT state, attempt, error FROM {table} WHERE id = '{ids['dead']}'") == [
        ("queued", 0, None)
    ]

    code, out, _ = run("dead", "purge", *base, "--older-than", "1h")
    assert (code, out) == (0, "purged 1 dead letter(s) older than 1h\n")
    assert execute(db_url, f"SELECT COUNT(*) FROM {table} WHERE state = 'dead'") == [(0,)]
    code, out, _ = run("dead", "list", *base)
    assert (code, out) == (0, "no dead letters\n")


def test_dead_retry_all_requeues_every_dead_letter_of_a_queue(db_url: str, table: str) -> None:
    ids = seed(db_url, table)
    base = ("--url", db_url, "--table", table)
    code, out, _ = run("dead", "retry", "--all", "--queue", "mail", *base)
    assert (code, out) == (0, "queued 1 dead letter(s) again with fresh attempts\n")
    assert execute(db_url, f"SELECT id FROM {table} WHERE state = 'dead'") == [(ids["old_dead"],)]
    code, out, _ = run("dead", "retry", "--all", *base)
    assert (code, out) == (0, "queued 1 dead letter(s) again with fresh attempts\n")
    code, _, err = run("dead", "retry", *base)
    assert code == 1
    assert "name the dead letters to retry" in err


def test_dead_purge_says_which_dead_letters_or_deletes_nothing(db_url: str, table: str) -> None:
    seed(db_url, table)
    base = ("--url", db_url, "--table", table)
    code, _, err = run("dead", "purge", *base)
    assert code == 2
    assert "one of the arguments --all --older-than is required" in err
    code, _, err = run("dead", "purge", "--all", "--older-than", "1h", *base)
    assert code == 2
    assert "not allowed with argument" in err
    assert execute(db_url, f"SELECT COUNT(*) FROM {table} WHERE state = 'dead'") == [(2,)]
    # Not at a terminal (a script, cron): --all is the answer, and nothing is asked.
    code, out, _ = run("dead", "purge", "--all", "--queue", "mail", *base)
    assert (code, out) == (0, "purged 1 dead letter(s) of queue 'mail'\n")
    assert execute(db_url, f"SELECT queue FROM {table} WHERE state = 'dead'") == [("default",)]


@pytest.mark.timeout(60)
def test_prune_deletes_what_workers_delete_as_they_go_for_every_queue(db_url: str, table: str) -> None:
    queue = syncjobs.DatabaseJobQueue(db_url, workers=1, table=table, queue="gone")
    queue.register(Quick)
    try:
        with queue:
            done = queue.dispatch(Quick(1))
            assert done.result(WAIT) is None
        old, recent = dispatch(db_url, table, Quick(2), Quick(3), queue="gone", delay=3600)
        assert queue.cancel(old)
        assert queue.cancel(recent)
        dead = queue.dispatch(Quick(-1))  # stays: dead letters are `dead purge`'s
    finally:
        queue.shutdown()  # again: cancel() and dispatch() opened its connections again
    execute(db_url, f"UPDATE {table} SET state = 'dead' WHERE id = ?", (dead,))
    # As if the queue's workers went away two hours ago, with all this left behind.
    hours_ago = 7200
    execute(db_url, f"UPDATE {table} SET finished_at = finished_at - ? WHERE id = ?", (hours_ago, old))
    execute(db_url, f"UPDATE {table}_results SET expires_at = expires_at - ?", (hours_ago,))
    execute(db_url, f"UPDATE {table}_finished SET finished_at = finished_at - ?", (hours_ago,))
    execute(db_url, f"UPDATE {table}_done SET bucket = bucket - ?", (hours_ago,))

    code, out, err = run("prune", "--url", db_url, "--table", table)
    assert code == 0, err
    assert re.fullmatch(
        r"pruned 1 expired record\(s\) of done jobs, 1 cancelled job\(s\), [1-9]\d* id\(s\) of jobs finished over "
        r"an hour ago, \d+ row\(s\) of workers gone, [1-9]\d* done count\(s\) over an hour old and 0 unique "
        r"key\(s\) no job holds\n",
        out,
    ), out
    assert execute(db_url, f"SELECT COUNT(*) FROM {table}_results")[0][0] == 0  # past its keep_result
    assert sorted(rows(db_url, table)) == [("cli.quick", "cancelled", 0), ("cli.quick", "dead", 0)]
    assert execute(db_url, f"SELECT COUNT(*) FROM {table}_finished")[0][0] == 0
    assert execute(db_url, f"SELECT COUNT(*) FROM {table}_done")[0][0] == 0
    [(kept,)] = execute(db_url, f"SELECT id FROM {table} WHERE state = 'cancelled'")
    assert kept == recent  # finished a moment ago: within --cancelled-older-than

    code, _, err = run("prune", "--url", db_url, "--table", table, "--cancelled-older-than", "7x")
    assert code == 2
    assert "--cancelled-older-than" in err


class Terminal:
    """A pseudo-terminal to give a command as its stdin: it asks there, and reads the answer typed."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        os.close(self.master)
        os.close(self.slave)


@pytest.mark.parametrize("answer", ["n", "", "yes"])
def test_dead_purge_on_a_terminal_says_how_many_and_asks_first(db_url: str, table: str, answer: str) -> None:
    seed(db_url, table)
    terminal = Terminal()
    try:
        # Typed ahead: the terminal holds the line until the command reads it, after its question.
        terminal.type(answer + "\n")
        code, out, err = run_at(terminal, "dead", "purge", "--all", "--url", db_url, "--table", table)
    finally:
        terminal.close()
    assert err.startswith(f"purge 2 dead letter(s) from {table}? [y/N] ")
    left = execute(db_url, f"SELECT COUNT(*) FROM {table} WHERE state = 'dead'")
    if answer == "yes":
        assert (code, out, left) == (0, "purged 2 dead letter(s)\n", [(0,)])
    else:
        assert (code, out, left) == (1, "", [(2,)])
        assert err.endswith("nothing purged\n")


def test_dead_purge_on_a_terminal_asks_nothing_with_yes_or_when_none_match(db_url: str, table: str) -> None:
    seed(db_url, table)
    base = ("--url", db_url, "--table", table)
    terminal = Terminal()
    try:
        # Dead 1 minute and 2 hours ago: none 3 hours old.
        code, out, _ = run_at(terminal, "dead", "purge", "--older-than", "3h", *base)
        assert (code, out) == (0, "no dead letters older than 3h to purge\n")
        code, out, err = run_at(terminal, "dead", "purge", "-y", "--older-than", "1h", *base)
        assert (code, out) == (0, "purged 1 dead letter(s) older than 1h\n")
        assert "[y/N]" not in err
    finally:
        terminal.close()
    assert execute(db_url, f"SELECT queue FROM {table} WHERE state = 'dead'") == [("mail",)]


def run_at(terminal: Terminal, *args: str) -> tuple[int, str, str]:
    """``run()`` with ``terminal`` as stdin; nothing is typed, so a command that asked would time out."""
    command = Command(*args, stdin=terminal.slave)
    try:
        code = command.wait()
    finally:
        command.kill()
    return code, "".join(command.out), "".join(command.err)


@pytest.mark.parametrize("command", [("stats",), ("dead", "list"), ("show", "some-id"), ("cancel", "some-id")])
def test_a_command_on_a_missing_table_says_to_migrate_and_creates_nothing(
    db_url: str, table: str, command: tuple[str, ...]
) -> None:
    code, out, err = run(*command, "--url", db_url, "--table", table)
    assert (code, out) == (1, "")
    assert f"there is no table {table} in the {dialect_for(db_url).name} database at " in err
    assert err.endswith("`syncjobs migrate` with the same --url creates it\n")
    with pytest.raises(Exception, match=r"(?i)no such table|does not exist|doesn't exist"):
        execute(db_url, f"SELECT COUNT(*) FROM {table}")  # nothing was made


def test_a_command_on_a_missing_sqlite_file_says_to_migrate_and_does_not_create_it(tmp_path: Any) -> None:
    path = tmp_path / "typo.db"
    for command in (("stats",), ("dead", "purge", "--all")):
        code, out, err = run(*command, "--url", f"sqlite:///{path}")
        assert (code, out) == (1, "")
        assert f"there is no SQLite database at {path}: `syncjobs migrate` with the same --url creates it" in err
        assert not path.exists()
    code, _, err = run("migrate", "--url", f"sqlite:///{path}")
    assert code == 0, err
    code, out, err = run("stats", "--url", f"sqlite:///{path}")
    assert (code, out) == (0, "no jobs\n\n0 live worker(s)\n"), err


@pytest.mark.parametrize("command", [("migrate", "--sql"), ("stats", "--json")])
def test_output_to_a_reader_that_went_away_ends_quietly(tmp_path: Any, command: tuple[str, ...]) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    assert run("migrate", "--url", url)[0] == 0
    read, write = os.pipe()
    os.close(read)  # as `| head` does once it has its lines
    proc = subprocess.Popen(
        [sys.executable, "-m", "syncjobs", *command, "--url", url],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    os.close(write)
    try:
        _, err = proc.communicate(timeout=WAIT)
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, err) == (128 + signal.SIGPIPE, "")


def test_an_app_that_is_not_a_queue_is_named_with_its_kind() -> None:
    code, _, err = run("stats", "--app", "tests.cli_jobs:ANSWER")
    assert code == 1
    assert "APP 'tests.cli_jobs:ANSWER' is an int, not a syncjobs queue" in err


@pytest.mark.parametrize("duration", ["soon", "7x", ""])
def test_a_bad_duration_is_a_usage_error_before_anything_is_read(duration: str) -> None:
    code, out, err = run("dead", "purge", "--url", "sqlite:///never/made.db", "--older-than", duration)
    assert (code, out) == (2, "")
    assert "usage: syncjobs dead purge" in err
    assert "argument --older-than: " in err
    assert "is not a duration" in err or "the duration is empty" in err


# -- demo and help ------------------------------------------------------------------------


def test_demo_on_a_database_url_prints_its_summary_and_stats_then_deletes_its_rows(db_url: str) -> None:
    code, out, err = run("demo", "--url", db_url, "--jobs", "60", timeout=60)
    assert code == 0, err
    assert "summary: 59 done, 1 dead, 0 pending" in out
    stats = out[out.index("$ syncjobs stats") :].splitlines()
    assert stats[1].startswith("QUEUE")
    assert stats[2].split()[1:5] == ["0", "0", "0", "1"]  # queued, running, parked, dead
    found = re.search(r"^deleted the demo's queue (demo-\w+) from table syncjobs_demo: 1 job\(s\)$", out, re.M)
    assert found is not None, out
    mark = dialect_for(db_url).placeholder
    for suffix in ("", "_results", "_done", "_workers"):
        left = execute(db_url, f"SELECT COUNT(*) FROM syncjobs_demo{suffix} WHERE queue = {mark}", (found[1],))
        assert left == [(0,)], suffix
    assert stats[2].split()[-1] == "59"  # done in the last minute


def test_help_explains_every_command_and_version_prints() -> None:
    code, out, _ = run("--help")
    assert code == 0
    for command in ("worker", "migrate", "stats", "dead", "demo"):
        assert command in out
    code, out, _ = run("worker", "--help", env={"COLUMNS": "80"})
    assert code == 0
    for option in (
        "--import",
        "--workers",
        "--queue",
        "--grace",
        "--log-level",
        "--log-format",
        "--max-jobs",
        "--burst",
    ):
        assert option in out
    # Python 3.13's argparse names the metavar once: "-w, --workers WORKERS".
    assert re.search(r"-w( WORKERS)?, --workers WORKERS", out), out
    assert re.search(r"-q( NAME)?, --queue NAME", out), out
    assert max(len(line) for line in out.splitlines()) <= 80, out  # wrapped for a terminal, as argparse's own
    code, out, _ = run("--version")
    assert (code, out) == (0, f"syncjobs {syncjobs.__version__}\n")
