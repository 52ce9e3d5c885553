"""Embedded mode under a real gunicorn: every worker process takes jobs from its start, and logs its runs.

gunicorn runs as a subprocess with two worker processes, with and without
``--preload``; the test dispatches from its own process, on the same
database, and never sends a request.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from syncjobs.database import DatabaseJobQueue
from tests.conftest import _reachable
from tests.helpers import wait_until

pytest.importorskip("gunicorn", reason="gunicorn is not installed (tox's flask env installs it)")

from gunicorn.config import KNOWN_SETTINGS

from tests.gunicorn_app import Meet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What gunicorn's own log says of each worker it forks.
BOOTED = re.compile(r"Booting worker with pid: (\d+)")
#: The line each worker's embedded workers log once they run, through Flask's default handler.
STARTED = re.compile(r"^\[[^]]+\] INFO in integration: embedded workers started: pid (\d+), 1 thread\(s\) on ", re.M)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, database_urls: dict[str, str]) -> str:
    name = request.param
    return database_urls[name] if name == "sqlite" else _reachable(name, database_urls[name])


@pytest.fixture
def queue_name() -> str:
    return f"gunicorn-{uuid.uuid4().hex[:12]}"  # its own queue: a server database's table is shared


class Gunicorn:
    def __init__(self, url: str, queue: str, log: Path, preload: bool) -> None:
        self.log = log
        args = [sys.executable, "-m", "gunicorn", "-w", "2", "-b", "127.0.0.1:0", "--graceful-timeout", "20"]
        if preload:
            args.append("--preload")
        if any(setting.name == "control_socket" for setting in KNOWN_SETTINGS):
            args.append("--no-control-socket")  # gunicorn 24+ opens one in the home directory by default
        env = {**os.environ, "PYTHONPATH": ROOT, "GUNICORN_APP_URL": url, "GUNICORN_APP_QUEUE": queue}
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [*args, "tests.gunicorn_app:create_app()"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def text(self) -> str:
        return self.log.read_text()

    def started_pids(self) -> set[int]:
        return {int(pid) for pid in STARTED.findall(self.text())}

    def stop(self) -> int:
        """SIGTERM, as a supervisor stops it; its exit code, which must come within a bound."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("preload", [False, True], ids=["fork-then-load", "preload"])
def test_each_gunicorn_worker_runs_jobs_from_its_start_and_logs_its_runs(
    url: str, queue_name: str, tmp_path: Path, preload: bool
) -> None:
    folder = tmp_path / "met"
    folder.mkdir()
    server = Gunicorn(url, queue_name, tmp_path / "gunicorn.log", preload)
    queue = DatabaseJobQueue(url, queue=queue_name)
    queue.register(Meet)
    try:
        # Both worker processes take jobs before any request: none is ever sent.
        wait_until(lambda: len(server.started_pids()) == 2, timeout=30, what="two started lines")
        workers = server.started_pids()
        assert workers == {int(pid) for pid in BOOTED.findall(server.text())}
        assert server.process.pid not in workers  # the master runs none, even when it built the app
        # One thread per process, and at most two rows claimed each: three jobs need both processes,
        # and each waits until the other process has begun one.
        handles = [queue.dispatch(Meet(folder=str(folder))) for _ in range(3)]
        ran_in = {handle.id: queue.result(handle.id, timeout=30) for handle in handles}
        assert set(ran_in.values()) == workers
    finally:
        code = server.stop()
        queue.shutdown()
    log = server.text()
    assert code == 0, log
    for job_id in ran_in:
        # Flask's default format, where gunicorn's stderr goes: the worker command's per-run line.
        line = rf"^\[[^]]+\] INFO in worker: job gunicorn_app\.meet \({job_id}\) run 1 of 1 in [\d.]+ms: done$"
        assert re.search(line, log, re.M), log
    assert "Traceback" not in log, log
    # Nothing of syncjobs' is left to Python's last resort, which prints a bare message.
    assert not re.search(r"^(job|embedded|syncjobs)", log, re.M), log
    assert "folder" not in log  # a payload is never logged at INFO or above
