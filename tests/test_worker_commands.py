"""The three worker commands (``syncjobs worker``, ``manage.py syncjobs_worker``, ``flask syncjobs worker``),
as real processes: the same signals, the same grace, the same exit codes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import queue as stdqueue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

import syncjobs
from tests.cli_jobs import Sleepy, Stubborn
from tests.faultproxy import FaultProxy
from tests.helpers import WAIT
from tests.test_database import execute

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SETTINGS = """
from tests.django_project.settings import *  # noqa: F403

DEBUG = True
SYNCJOBS = {{"URL": {url!r}, "WORKERS": 1}}
"""

COMMANDS = ["syncjobs", "django", "flask", "django --reload"]
#: The three commands, once each.
EACH = ["syncjobs", "django", "flask"]


class Worker:
    """A worker command in a process group of its own (as a terminal's foreground job), read line by line."""

    def __init__(self, argv: list[str], path: str) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,
        )
        self.lines: stdqueue.Queue[str] = stdqueue.Queue()
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(stream, into), daemon=True)
            for stream, into in ((self.proc.stdout, []), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line)
            self.lines.put(line)

    def expect(self, pattern: str, timeout: float = 3 * WAIT) -> re.Match[str]:
        found = self.expect_within(pattern, timeout)
        if found is None:
            raise AssertionError(f"no line matching {pattern!r}; stderr: {''.join(self.err)}")
        return found

    def expect_within(self, pattern: str, timeout: float) -> re.Match[str] | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except stdqueue.Empty:
                return None
            found = re.search(pattern, line)
            if found:
                return found

    def ctrl_c(self) -> None:
        """What a terminal does: SIGINT to every process of the foreground group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self) -> int:
        code = self.proc.wait(timeout=WAIT)
        self._close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            # --reload's worker runs in a session of its own: not in this group.
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
                for child in children:
                    os.killpg(int(child), signal.SIGKILL)
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        for reader in self._readers:
            reader.join(timeout=WAIT)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def command_line(command: str, url: str, tmp_path: Path, *options: str) -> list[str]:
    if command == "syncjobs":
        return [sys.executable, "-m", "syncjobs", "worker", "--url", url, "--import", "tests.cli_jobs", *options]
    if command.startswith("django"):
        django = pytest.importorskip("django", reason="the Django integration needs Django")
        if django.VERSION < (6, 0):
            pytest.skip("the test project needs Django 6 (the tox django env)")
        (tmp_path / "worker_settings.py").write_text(SETTINGS.format(url=url))
        extra = ["--reload"] if command.endswith("--reload") else []
        return [sys.executable, "-m", "django", "syncjobs_worker", "--settings", "worker_settings", *extra, *options]
    if importlib.util.find_spec("flask") is None:
        pytest.skip("Flask is not installed")
    app = f"tests.flask_app:create_app(SYNCJOBS_URL={url!r})"
    return [sys.executable, "-m", "flask", "--app", app, "syncjobs", "worker", *options]


@pytest.fixture
def started() -> Iterator[list[Worker]]:
    workers: list[Worker] = []
    yield workers
    for worker in workers:
        worker.kill()


def start(started: list[Worker], command: str, url: str, tmp_path: Path, *options: str) -> Worker:
    worker = Worker(command_line(command, url, tmp_path, *options), os.pathsep.join([ROOT, str(tmp_path)]))
    started.append(worker)
    worker.expect(r"^syncjobs worker ready: pid \d+")
    return worker


def change_code(worker: Worker, tmp_path: Path, noticed: str) -> None:
    """Touch the settings module until the worker's reloader says so.

    Its watcher takes the files' first times once it runs, which may be after
    a first touch: a change it saw as the first time is no change.
    """
    module = tmp_path / "worker_settings.py"
    deadline = time.monotonic() + 3 * WAIT
    while time.monotonic() < deadline:
        later = max(time.time(), module.stat().st_mtime) + 10  # later each time
        os.utime(module, (later, later))
        if worker.expect_within(noticed, 1.5):
            return
    raise AssertionError(f"the reloader never noticed the change; stderr: {''.join(worker.err)}")


def dispatch(url: str, job: syncjobs.Job) -> str:
    producer = syncjobs.DatabaseJobQueue(url, workers=0)
    producer.register(type(job))
    try:
        return producer.dispatch(job)
    finally:
        producer.shutdown()


def rows(url: str) -> list[tuple[object, ...]]:
    return execute(url, "SELECT name, state, attempt FROM syncjobs_jobs")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", COMMANDS)
def test_sigterm_stops_with_the_grace_and_leaves_a_job_that_ignores_cancellation(
    command: str, tmp_path: Path, started: list[Worker]
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = start(started, command, url, tmp_path, "--grace", "0.5")
    job_id = dispatch(url, Stubborn(300))
    worker.expect(rf"^started stubborn {job_id}")
    began = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert time.monotonic() - began < WAIT  # not the job's 300 s
    err = "".join(worker.err)
    assert "SIGTERM: stopping; running jobs get 0.5s" in err
    assert "1 job(s) ignored cancellation; exiting without them" in err
    assert rows(url) == [("cli.stubborn", "queued", 1)]  # handed back, its run spent


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_gives_the_grace_and_a_second_hands_back_at_once(
    command: str, tmp_path: Path, started: list[Worker]
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = start(started, command, url, tmp_path, "--grace", "300")
    job_id = dispatch(url, Sleepy(300))
    worker.expect(rf"^started sleepy {job_id}")
    worker.ctrl_c()
    worker.expect(r"SIGINT: stopping; running jobs get 300s")
    assert worker.proc.poll() is None  # in the grace
    worker.ctrl_c()
    assert worker.wait() == 128 + signal.SIGINT
    err = "".join(worker.err)
    assert "SIGINT again: handing running jobs back now" in err
    assert f"job cli.sleepy ({job_id}) still running when a second signal cut the shutdown grace short" in err
    assert "after the shutdown grace" not in err  # 300 s: it was not given
    assert rows(url) == [("cli.sleepy", "queued", 1)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_job_that_finishes_in_the_grace_is_done(command: str, tmp_path: Path, started: list[Worker]) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = start(started, command, url, tmp_path, "--grace", "30")
    job_id = dispatch(url, Sleepy(1.5))
    worker.expect(rf"^started sleepy {job_id}")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert re.search(rf"job cli\.sleepy \({job_id}\) run 1 of 5 in [\d.]+ms: done", "".join(worker.err))
    assert rows(url) == []


@pytest.mark.timeout(90)
def test_reload_restarts_the_worker_after_the_grace_when_the_code_changes(
    tmp_path: Path, started: list[Worker]
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = start(started, "django --reload", url, tmp_path, "--grace", "30")
    first = worker.proc.pid
    job_id = dispatch(url, Sleepy(2))
    worker.expect(rf"^started sleepy {job_id} attempt 0 pid (\d+)")
    change_code(worker, tmp_path, r"worker_settings\.py changed: stopping; running jobs get 30s")
    # The running job finished in its grace, then a new worker process started.
    second = worker.expect(r"^syncjobs worker ready: pid (\d+)")
    assert int(second.group(1)) != first
    assert rows(url) == []
    assert re.search(rf"job cli\.sleepy \({job_id}\) run 1 of 5 in [\d.]+ms: done", "".join(worker.err))
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.timeout(90)
def test_reload_stops_the_worker_with_the_grace_when_its_terminal_hangs_up(
    tmp_path: Path, started: list[Worker]
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = start(started, "django --reload", url, tmp_path, "--grace", "0.5")
    job_id = dispatch(url, Sleepy(300))
    worker.expect(rf"^started sleepy {job_id}")
    worker.proc.send_signal(signal.SIGHUP)  # to the supervisor: the worker is in a session of its own
    assert worker.wait() == 0
    assert "SIGTERM: stopping; running jobs get 0.5s" in "".join(worker.err)
    assert rows(url) == [("cli.sleepy", "queued", 1)]


@pytest.mark.timeout(90)
def test_a_signal_during_a_reload_makes_the_stop_final_and_a_second_cuts_the_grace(
    tmp_path: Path, started: list[Worker]
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    worker = start(started, "django --reload", url, tmp_path, "--grace", "300")
    job_id = dispatch(url, Sleepy(300))
    worker.expect(rf"^started sleepy {job_id}")
    change_code(worker, tmp_path, r"worker_settings\.py changed: stopping; running jobs get 300s")
    worker.proc.send_signal(signal.SIGTERM)
    worker.expect(r"SIGTERM: stopping for good; running jobs keep their grace")
    assert worker.proc.poll() is None  # still in the grace
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 128 + signal.SIGTERM  # and no new worker started
    assert "SIGTERM again: handing running jobs back now" in "".join(worker.err)
    assert rows(url) == [("cli.sleepy", "queued", 1)]


def run_to_end(command: str, url: str, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """A worker command run to its exit, stdout and stderr in one stream, in the order written."""
    return subprocess.run(
        command_line(command, url, tmp_path, *options),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, str(tmp_path)])},
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", EACH)
def test_burst_says_it_is_ready_before_any_job_runs(command: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    ids = [dispatch(url, Sleepy(0)) for _ in range(3)]  # waiting when the worker starts
    unknown = dispatch(url, Unknown())  # no worker command registers it: handed back, logged
    done = run_to_end(command, url, tmp_path, "--burst")
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    [ready] = [i for i, line in enumerate(lines) if line.startswith("syncjobs worker ready: pid")]
    runs = [i for i, line in enumerate(lines) if "started sleepy" in line or re.search(r"run \d+ of \d+", line)]
    assert len(runs) == 6, done.stdout  # each job's own line, and its run line
    [handed_back] = [i for i, line in enumerate(lines) if f"({unknown}): no job class is registered" in line]
    assert ready < min(*runs, handed_back), done.stdout
    assert all(f"({job_id}) run 1 of 5" in done.stdout for job_id in ids)


@dataclasses.dataclass
class Unknown(syncjobs.Job):
    NAME = "tests.known_to_no_worker"

    def run(self) -> None:
        raise AssertionError("no worker command has this class")


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port: int = listener.getsockname()[1]
        return port


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", EACH)
def test_a_database_it_cannot_reach_is_one_line_at_start(command: str, tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="the PostgreSQL driver is the postgres extra")
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/test"  # nothing listens there
    done = run_to_end(command, url, tmp_path, "--skip-checks" if command == "django" else "--burst")
    assert done.returncode == 1, done.stdout
    [line] = done.stdout.splitlines()
    said = rf"(error|CommandError): cannot reach the postgresql database at {re.escape(url)}: OperationalError: "
    assert re.search(said, line)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", EACH)
def test_wait_for_db_starts_once_the_database_answers(
    command: str, tmp_path: Path, started: list[Worker], proxy: FaultProxy, server_url: str
) -> None:
    proxy.refuse_new()  # as a database container still starting does
    url = proxy.url(server_url)
    worker = Worker(command_line(command, url, tmp_path, "--wait-for-db", "60"), os.pathsep.join([ROOT, str(tmp_path)]))
    started.append(worker)
    worker.expect(r"cannot reach the \w+ database at .* yet \(.*\): trying again for up to 60s")
    assert worker.proc.poll() is None
    proxy.resume()
    worker.expect(r"^syncjobs worker ready: pid \d+")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert "".join(worker.err).count("cannot reach") == 1  # said once, not once per try
