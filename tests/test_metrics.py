"""Prometheus metrics (the prometheus extra): on every backend, and ``syncjobs worker --metrics-port`` over HTTP."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import syncjobs
from syncjobs import QueueError
from syncjobs.metrics import Metrics
from tests.cli_jobs import Quick
from tests.conftest import TEST_TABLE, QueueFactory
from tests.faultproxy import FaultProxy
from tests.helpers import WAIT, Probe, ProbeJob, refuse_label_13, wait_until
from tests.test_database import execute
from tests.test_worker_commands import ROOT, Worker, free_port, start

pytestmark = pytest.mark.timeout(60)

#: The worker processes' table: theirs alone, as they run every job of its default queue.
CLI_TABLE = "syncjobs_metrics"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_dispatches_runs_outcomes_and_durations_are_counted(make_queue: QueueFactory) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, depth_every=0)
    queue = make_queue(1)  # one worker: the in-progress gauge is 1 while the blocked job runs
    metrics.instrument(queue)

    queue.around_dispatch(refuse_label_13)

    ok, fatal, flaky, blocked = Probe(), Probe("fatal"), Probe("crash", "ok"), Probe("block")
    label = queue.queue_label
    with queue:
        for probe in (ok, fatal, flaky):
            queue.dispatch(ProbeJob(probe.id))
        with pytest.raises(QueueError, match="label 13"):
            queue.dispatch(ProbeJob(ok.id, label=13))
        assert queue.join(WAIT)
        queue.dispatch(ProbeJob(blocked.id))
        blocked.wait_runs(1)
        assert value(registry, "syncjobs_runs_in_progress", queue=label) == 1
        blocked.release.set()
        assert queue.join(WAIT)
        # Read while the queue is open: a reading after its shutdown would open connections nothing closes.
        # A run is observed just after its outcome is written, which join() waits for: wait for the last.
        duration_count = ("syncjobs_run_duration_seconds_count", {"queue": label, "job_name": "tests.probe"})
        wait_until(lambda: registry.get_sample_value(*duration_count) == 5, what="5 runs observed")
        wait_until(lambda: value(registry, "syncjobs_runs_in_progress", queue=label) == 0, what="no run in progress")
        assert value(registry, "syncjobs_dispatched_total", queue=label, job_name="tests.probe") == 4  # not the refused
        runs = {
            outcome: value(registry, "syncjobs_runs_total", queue=label, job_name="tests.probe", outcome=outcome)
            for outcome in ("done", "retry", "dead", "cancelled", "aborted")
        }
        assert runs == {"done": 3, "retry": 1, "dead": 1, "cancelled": 0, "aborted": 0}
        assert value(registry, "syncjobs_run_duration_seconds_count", queue=label, job_name="tests.probe") == 5
        assert value(registry, "syncjobs_run_duration_seconds_sum", queue=label, job_name="tests.probe") > 0
        assert value(registry, "syncjobs_runs_in_progress", queue=label) == 0
        # The dead job is one of the queue's, as its record or its row is kept.
        assert value(registry, "syncjobs_jobs", queue=label, state="dead") == 1
        assert value(registry, "syncjobs_jobs", queue=label, state="queued") == 0


def test_depth_is_read_from_the_queue_at_each_scrape(make_queue: QueueFactory) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, depth_every=0)
    queue = make_queue(1)
    metrics.instrument(queue)
    label = queue.queue_label
    probe = Probe()
    queue.start(held=True)  # the workers claim nothing until released
    try:
        for _ in range(3):
            queue.dispatch(ProbeJob(probe.id))
        for _ in range(2):
            queue.dispatch(ProbeJob(probe.id), delay=3600)
        depth = {state: value(registry, "syncjobs_jobs", queue=label, state=state) for state in ("queued", "parked")}
        assert depth == {"queued": 3, "parked": 2}
        assert 0 <= value(registry, "syncjobs_oldest_ready_age_seconds", queue=label) < 60
        queue.release()
        probe.wait_runs(3)
        wait_until(lambda: value(registry, "syncjobs_jobs", queue=label, state="queued") == 0)
        assert value(registry, "syncjobs_jobs", queue=label, state="parked") == 2
    finally:
        queue.shutdown(grace=0)


def test_a_reading_serves_the_scrapes_within_its_interval(make_queue: QueueFactory) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, depth_every=3600)
    queue = make_queue(0)
    metrics.instrument(queue)
    probe = Probe()
    queue.dispatch(ProbeJob(probe.id))
    assert value(registry, "syncjobs_jobs", queue=queue.queue_label, state="queued") == 1
    queue.dispatch(ProbeJob(probe.id))
    # One reading an hour: the second job is not seen until then (one count for many scrapers).
    assert value(registry, "syncjobs_jobs", queue=queue.queue_label, state="queued") == 1


def test_a_queue_instrumented_twice_counts_once_and_queues_of_one_name_add_up() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, depth_every=0)
    first, second = syncjobs.InMemoryJobQueue(1), syncjobs.InMemoryJobQueue(1)  # both "default"
    for queue in (first, second):
        queue.register(ProbeJob)
        metrics.instrument(queue)
    metrics.instrument(first)
    blocked = Probe("block")
    with first, second:
        first.dispatch(ProbeJob(blocked.id))
        second.dispatch(ProbeJob(blocked.id))
        second.dispatch(ProbeJob(blocked.id))  # waits: the one worker is blocked
        blocked.wait_runs(2)
        assert value(registry, "syncjobs_runs_in_progress", queue="default") == 2
        assert value(registry, "syncjobs_jobs", queue="default", state="running") == 2
        assert value(registry, "syncjobs_jobs", queue="default", state="queued") == 1
        blocked.release.set()
        assert first.join(WAIT)
        assert second.join(WAIT)
    assert value(registry, "syncjobs_dispatched_total", queue="default", job_name="tests.probe") == 3
    assert value(registry, "syncjobs_runs_total", queue="default", job_name="tests.probe", outcome="done") == 3


def test_twins_count_each_dispatch_and_run_once(db_url: str) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, depth_every=0)
    a, b = f"metrics-a-{uuid.uuid4().hex[:8]}", f"metrics-b-{uuid.uuid4().hex[:8]}"
    first = syncjobs.DatabaseJobQueue(db_url, workers=1, table=TEST_TABLE, queue=a, poll_interval=0.2)
    first.register(ProbeJob)
    second = first.for_queue(b)  # shares its hooks and run wrappers
    same = first.for_queue(workers=2)  # a twin of the same name: the same rows
    metrics.instrument(first)
    metrics.instrument(second)
    metrics.instrument(same)
    probe = Probe()
    try:
        first.start()
        second.start()
        first.dispatch(ProbeJob(probe.id))
        second.dispatch(ProbeJob(probe.id))
        second.dispatch(ProbeJob(probe.id))
        assert first.join(WAIT)
        assert second.join(WAIT)
        done = "syncjobs_runs_total"
        wait_until(lambda: value(registry, done, queue=b, job_name="tests.probe", outcome="done") == 2)
        wait_until(lambda: value(registry, "syncjobs_runs_in_progress", queue=a) == 0)
        assert value(registry, "syncjobs_dispatched_total", queue=a, job_name="tests.probe") == 1
        assert value(registry, "syncjobs_dispatched_total", queue=b, job_name="tests.probe") == 2
        assert value(registry, done, queue=a, job_name="tests.probe", outcome="done") == 1
        assert value(registry, done, queue=b, job_name="tests.probe", outcome="done") == 2
        assert value(registry, "syncjobs_runs_in_progress", queue=a) == 0
        parked = first.dispatch(ProbeJob(probe.id), delay=3600)
        assert value(registry, "syncjobs_jobs", queue=a, state="parked") == 1  # read once, not twice
        assert first.cancel(parked.id)
    finally:
        # Last: a reading after a shutdown would open connections that nothing closes.
        for queue in (first, second, same):
            queue.shutdown(grace=0)


def test_a_queue_that_cannot_be_counted_is_left_out_of_the_scrape_and_logged(
    server_url: str, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, depth_every=0)
    lost = syncjobs.DatabaseJobQueue(
        proxy.url(server_url), workers=0, table=TEST_TABLE, queue="metrics-lost", dispatch_timeout=1.0
    )
    counted = syncjobs.InMemoryJobQueue(1)  # not started until the end
    counted.register(ProbeJob)
    metrics.instrument(lost)
    metrics.instrument(counted)
    counted.dispatch(ProbeJob(Probe().id))
    try:
        assert value(registry, "syncjobs_jobs", queue="metrics-lost", state="queued") == 0  # counted while up
        proxy.refuse()  # the server is gone
        assert value(registry, "syncjobs_jobs", queue="default", state="queued") == 1
        assert registry.get_sample_value("syncjobs_jobs", {"queue": "metrics-lost", "state": "queued"}) is None
        assert any("cannot count the jobs of queue 'metrics-lost'" in r.getMessage() for r in caplog.records)
        assert all(r.levelno < logging.ERROR for r in caplog.records)
    finally:
        proxy.resume()
        lost.shutdown()
        with counted:  # its job runs: nothing left for the interpreter's exit to warn of
            assert counted.join(WAIT)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def runs_ended(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], *outcomes: str) -> float:
    """The runs of ``cli.quick`` one process counted, of ``outcomes`` (default: done and dead)."""
    return sum(
        samples.get(
            ("syncjobs_runs_total", (("job_name", "cli.quick"), ("outcome", outcome), ("queue", "default"))), 0.0
        )
        for outcome in outcomes or ("done", "dead")
    )


@pytest.mark.timeout(120)
def test_two_worker_processes_each_serve_their_metrics_over_http(db_url: str, tmp_path: Path) -> None:
    """Several processes on one host: one port each; their counters add up to every run, their depth agrees."""
    producer = syncjobs.DatabaseJobQueue(db_url, workers=0, table=CLI_TABLE)
    producer.register(Quick)
    producer.install_schema()
    execute(db_url, f"DELETE FROM {CLI_TABLE}")  # a table of this test's own: nothing from an earlier run
    ports = [free_port(), free_port()]
    workers: list[Worker] = []
    try:
        for port in ports:
            start(
                workers,
                "syncjobs",
                db_url,
                tmp_path,
                "--table",
                CLI_TABLE,
                "--workers",
                "2",
                "--metrics-port",
                str(port),
            )
        producer.dispatch_many([Quick(n) for n in range(40)] + [Quick(-1)])
        wait_until(lambda: sum(runs_ended(scrape(port)) for port in ports) == 41, timeout=3 * WAIT)
        each = [scrape(port) for port in ports]
        assert sum(runs_ended(samples, "done") for samples in each) == 40
        assert sum(runs_ended(samples, "dead") for samples in each) == 1
        # The table's figures, the same from each process, once its reading is renewed (every DEPTH_EVERY s).
        dead_rows = ("syncjobs_jobs", (("queue", "default"), ("state", "dead")))
        queued_rows = ("syncjobs_jobs", (("queue", "default"), ("state", "queued")))

        def table_figures(port: int) -> tuple[float | None, float | None]:
            # From one reading: a reading taken after the dead letter died, and before the last jobs ran, has both.
            samples = scrape(port)
            return samples.get(dead_rows), samples.get(queued_rows)

        for port in ports:
            wait_until(
                lambda: table_figures(port) == (1, 0),  # noqa: B023 - called at once
                timeout=3 * WAIT,
                what=f"one dead and none queued, from the process on port {port}",
            )
    finally:
        for worker in workers:
            worker.kill()
        producer.purge_dead()
        producer.shutdown()


APP = """
import syncjobs
from syncjobs.metrics import Metrics
from tests.cli_jobs import Quick

queue = syncjobs.DatabaseJobQueue({url!r}, table={table!r})
queue.register(Quick)
Metrics().instrument(queue)  # the app's own, on prometheus_client's default registry
"""


@pytest.mark.timeout(120)
def test_the_worker_serves_its_metrics_beside_an_apps_own(tmp_path: Path, database_urls: dict[str, str]) -> None:
    url = database_urls["sqlite"]
    (tmp_path / "metered_app.py").write_text(APP.format(url=url, table=CLI_TABLE))
    port = free_port()
    workers: list[Worker] = []
    producer = syncjobs.DatabaseJobQueue(url, workers=0, table=CLI_TABLE)
    producer.register(Quick)
    producer.install_schema()
    execute(url, f"DELETE FROM {CLI_TABLE}")
    try:
        worker = Worker(
            [sys.executable, "-m", "syncjobs", "worker", "metered_app:queue", "--metrics-port", str(port)],
            os.pathsep.join([ROOT, str(tmp_path)]),
        )
        workers.append(worker)
        worker.expect(r"^syncjobs worker ready: pid \d+")
        producer.dispatch(Quick(1))
        wait_until(lambda: runs_ended(scrape(port), "done") == 1, timeout=3 * WAIT)
    finally:
        for each in workers:
            each.kill()
        producer.shutdown()


def test_a_metrics_port_taken_is_one_line_at_start(tmp_path: Path) -> None:
    with contextlib.closing(socket.create_server(("127.0.0.1", 0))) as taken:
        port = taken.getsockname()[1]
        url = f"sqlite:///{tmp_path}/jobs.db"
        done = subprocess.run(
            [sys.executable, "-m", "syncjobs", "worker", "--url", url, "--metrics-port", str(port)],
            check=False,
            capture_output=True,
            text=True,
            timeout=3 * WAIT,
            cwd=ROOT,
        )
    assert done.returncode != 0
    assert f"--metrics-port: cannot serve on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
