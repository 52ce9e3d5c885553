"""syncjobs in a real Django project, through Django's test client, admin, commands and Tasks."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.tasks import TaskResultStatus, task
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test import Client, override_settings
from django.utils import timezone

import syncjobs
import syncjobs.contrib.django as sj
from syncjobs.contrib.django import conf
from syncjobs.contrib.django.models import FinishedJob, QueuedJob, ScheduleRecord, TaskResultRecord
from syncjobs.contrib.django.tasks import RunTask
from syncjobs.errors import JobCancelled
from syncjobs.status import Progress
from tests.django_project.forwarder import Forwarder
from tests.django_project.shop import jobs
from tests.django_project.shop.models import Order

pytestmark = [pytest.mark.django_db(transaction=True, databases=list(settings.DATABASES)), pytest.mark.timeout(120)]


def job_rows(alias: str) -> list[tuple[Any, ...]]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT name, state, attempt FROM syncjobs_jobs ORDER BY created_at")
        return [tuple(row) for row in cursor.fetchall()]


def run_worker(*options: str) -> str:
    out = io.StringIO()
    call_command("syncjobs_worker", "--burst", *options, stdout=out)
    return out.getvalue()


# -- transactional dispatch ----------------------------------------------------------


def test_a_view_that_fails_after_dispatch_leaves_neither_the_row_nor_the_job(alias: str) -> None:
    client = Client(raise_request_exception=False)
    response = client.post("/orders/", {"number": "A-1", "database": alias, "fail": "1"})
    assert response.status_code == 500
    assert not Order.objects.using(alias).filter(number="A-1").exists()
    assert job_rows(alias) == []


def test_a_committed_order_runs_its_job_in_the_worker_command(alias: str) -> None:
    response = Client().post("/orders/", {"number": "A-2", "database": alias})
    assert response.status_code == 200
    job_id = response.json()["job"]
    assert job_rows(alias) == [("shop.confirm_order", "queued", 0)]
    assert not Order.objects.using(alias).get(number="A-2").confirmed

    out = run_worker("--workers", "2")
    assert out.startswith("syncjobs worker ready: pid ")
    assert Order.objects.using(alias).get(number="A-2").confirmed
    assert job_rows(alias) == []
    assert job_id


def test_a_function_task_is_dispatched_in_the_callers_transaction(alias: str) -> None:
    try:
        with transaction.atomic(using=alias):
            Order.objects.using(alias).create(number="F-1")
            jobs.confirm.using(using=alias).dispatch("F-1", database=alias)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    assert job_rows(alias) == []
    with transaction.atomic(using=alias):
        Order.objects.using(alias).create(number="F-2")
        job_id = jobs.confirm.using(using=alias).dispatch("F-2", database=alias)
    assert isinstance(job_id, syncjobs.JobHandle)
    assert job_rows(alias) == [("shop.confirm", "queued", 0)]
    assert job_id.status().state == "queued"  # type: ignore[union-attr]
    with pytest.raises(syncjobs.Fatal, match="no order X-9"):  # called here, it just runs
        jobs.confirm("X-9", database=alias)
    run_worker()
    assert job_rows(alias) == []
    assert Order.objects.using(alias).get(number="F-2").confirmed
    assert job_id.status().state == "done"  # type: ignore[union-attr]
    with pytest.raises(
        syncjobs.QueueError, match=r"task 'shop\.confirm': confirm\(\) got an unexpected keyword argument 'db'"
    ):
        jobs.confirm.dispatch("F-3", db=alias)
    assert job_id


def test_memory_backend_hands_the_job_over_on_commit_only() -> None:
    with override_settings(SYNCJOBS={"BACKEND": "memory", "WORKERS": 1}):
        try:
            with transaction.atomic():
                Order.objects.create(number="M-1")
                sj.dispatch(jobs.ConfirmOrder(number="M-1", database="default"))
                assert sj.get_queue().pending_count() == 0  # not before the commit
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        assert sj.get_queue().pending_count() == 0  # and never, after a rollback

        with transaction.atomic():
            Order.objects.create(number="M-2")
            sj.dispatch(jobs.ConfirmOrder(number="M-2", database="default"))
            assert sj.get_queue().pending_count() == 0
        # Committed: handed over, and run by workers inside this process.
        assert sj.get_queue().join(timeout=10)
        assert Order.objects.get(number="M-2").confirmed


def test_a_memory_queue_that_cannot_start_takes_no_job_and_starts_at_the_next_dispatch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse() -> None:  # what an exiting interpreter (Python 3.12+) answers
        raise RuntimeError("can't create new thread at interpreter shutdown")

    with override_settings(SYNCJOBS={"BACKEND": "memory", "WORKERS": 1}):
        queue = sj.get_queue()
        monkeypatch.setattr(queue, "start", refuse)
        Order.objects.create(number="S-1")
        with pytest.raises(RuntimeError, match="can't create new thread"):
            sj.dispatch(jobs.ConfirmOrder(number="S-1", database="default"))
        assert queue.pending_count() == 0  # refused: not handed over to workers that do not run
        monkeypatch.undo()
        sj.dispatch(jobs.ConfirmOrder(number="S-1", database="default"))
        assert queue.join(timeout=10)
        assert Order.objects.get(number="S-1").confirmed


def test_a_job_that_cannot_be_dispatched_is_refused_at_once_even_inside_atomic() -> None:
    with (
        override_settings(SYNCJOBS={"BACKEND": "memory"}),
        pytest.raises(syncjobs.QueueError, match=r"job 'shop.confirm_order'.*JSON"),
        transaction.atomic(),
    ):
        sj.dispatch(jobs.ConfirmOrder(number=object(), database="default"))  # type: ignore[arg-type]


def test_bad_settings_name_the_key() -> None:
    with (
        override_settings(SYNCJOBS={"DATABASE": "nope"}),
        pytest.raises(ImproperlyConfigured, match=r"DATABASE 'nope' is not in settings\.DATABASES"),
    ):
        sj.get_queue()
    with (
        override_settings(SYNCJOBS={"WORKERS": 2, "THREADS": 3}),
        pytest.raises(ImproperlyConfigured, match=r"unknown key.*'THREADS'"),
    ):
        sj.get_queue()
    with (
        override_settings(SYNCJOBS={"TIMEOUT": "30"}),
        pytest.raises(ImproperlyConfigured, match=r"SYNCJOBS TIMEOUT must be a number of seconds > 0 \(or None\)"),
    ):
        sj.get_queue()


def test_a_timeout_in_the_settings_is_every_queues_default(alias: str) -> None:
    with override_settings(SYNCJOBS={"DATABASE": alias, "TIMEOUT": 30}):
        assert sj.get_queue().timeout == 30.0
        assert [queue.timeout for queue in sj.worker_queues(["default", "reports"])] == [30.0, 30.0]
    with override_settings(SYNCJOBS={"BACKEND": "memory", "TIMEOUT": 2.5}):
        assert sj.get_queue().timeout == 2.5


def test_how_long_a_job_no_worker_knows_waits_is_a_setting(alias: str) -> None:
    with override_settings(SYNCJOBS={"DATABASE": alias}):
        assert sj.get_queue().unknown_job_wait == 600.0  # type: ignore[attr-defined]
    with override_settings(SYNCJOBS={"DATABASE": alias, "UNKNOWN_JOB_WAIT": 60}):
        assert [q.unknown_job_wait for q in sj.worker_queues(["default", "reports"])] == [60.0, 60.0]  # type: ignore[attr-defined]
    with (
        override_settings(SYNCJOBS={"DATABASE": alias, "UNKNOWN_JOB_WAIT": -1}),
        pytest.raises(ImproperlyConfigured, match=r"SYNCJOBS UNKNOWN_JOB_WAIT must be a number of seconds >= 0"),
    ):
        sj.get_queue()


def test_the_worker_command_refuses_the_memory_backend() -> None:
    with (
        override_settings(SYNCJOBS={"BACKEND": "memory"}),
        pytest.raises(CommandError, match="memory backend: its jobs run inside the web process"),
    ):
        run_worker()  # a CommandError: one line from manage.py


def ops(*args: str) -> int:
    """``manage.py syncjobs ARGS``: its exit status (its output goes to the captured stdout and stderr)."""
    try:
        call_command("syncjobs", *args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_manage_py_syncjobs_works_on_the_table_the_settings_name(
    alias: str, capsys: pytest.CaptureFixture[str]
) -> None:
    waiting = str(sj.dispatch(jobs.ConfirmOrder(number="A-1", database=alias), delay=3600))
    doomed = str(sj.dispatch(jobs.ConfirmOrder(number="A-2", database=alias), delay=3600))
    capsys.readouterr()

    assert ops("stats", "--json") == 0
    [queue] = json.loads(capsys.readouterr().out)["queues"]
    assert (queue["queue"], queue["parked"]) == ("default", 2)

    assert ops("show", waiting, "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["id"], shown["name"], shown["state"]) == (waiting, "shop.confirm_order", "scheduled")

    assert ops("cancel", doomed) == 0
    capsys.readouterr()
    assert sj.get_queue().status(doomed).state == "cancelled"  # type: ignore[union-attr]

    assert ops("dead", "list", "--json") == 0
    assert capsys.readouterr().out == ""  # a cancelled job is no dead letter

    assert ops("migrate", "--sql") == 0
    assert "CREATE TABLE IF NOT EXISTS syncjobs_jobs" in capsys.readouterr().out

    assert ops("show", "no-such-job") == 1
    assert capsys.readouterr().err == (
        "manage.py syncjobs show: error: no job with id 'no-such-job' "
        "(never dispatched, or finished longer than its keep_result ago)\n"
    )


def test_manage_py_syncjobs_says_in_one_line_that_the_memory_backend_has_no_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with override_settings(SYNCJOBS={"BACKEND": "memory"}):
        assert ops("stats") == 1
    assert capsys.readouterr().err == (
        "manage.py syncjobs stats: error: settings.SYNCJOBS uses the memory backend: its jobs live inside "
        "the web process; there is no table\n"
    )


def test_each_command_has_its_own_help_with_the_settings_that_give_the_defaults(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.django_project.settings", "PYTHONPATH": str(root)}

    def django_help(*args: str) -> str:
        command = [sys.executable, "-m", "django", *args, "--help"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    worker = django_help("syncjobs_worker")
    assert 'worker threads per queue (default: SYNCJOBS["WORKERS"], 4 unless set)' in " ".join(worker.split())
    assert "APP" not in worker  # the `syncjobs` command's positional: no such thing here
    ops_help = " ".join(django_help("syncjobs").split())
    for command in ("migrate", "stats", "show", "cancel", "dead", "prune"):
        assert re.search(rf"\b{command} [a-z]", ops_help), command
    stats = django_help("syncjobs", "stats")
    assert "--json" in stats
    # The settings say where the table is.
    assert "--url" not in stats
    assert "--app" not in stats


def test_the_app_migration_matches_its_models() -> None:
    out = io.StringIO()
    call_command("makemigrations", "syncjobs", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


# -- admin ------------------------------------------------------------------------------


def test_the_admin_lists_filters_searches_and_acts_on_dead_letters(alias: str) -> None:
    queue = sj.get_queue()
    assert isinstance(queue, syncjobs.DatabaseJobQueue)
    dead_id = queue.dispatch(jobs.ConfirmOrder(number="nowhere", database=alias))  # Fatal: no such order
    live_id = queue.dispatch(jobs.ConfirmOrder(number="later", database=alias), delay=3600)
    run_worker()
    assert sorted(job_rows(alias)) == [("shop.confirm_order", "dead", 1), ("shop.confirm_order", "queued", 0)]

    admin_user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    client.force_login(admin_user)
    base = "/admin/syncjobs/queuedjob/"
    page = client.get(base).content.decode()
    assert dead_id in page
    assert live_id in page
    page = client.get(base, {"state__exact": "dead"}).content.decode()
    assert dead_id in page
    assert live_id not in page
    page = client.get(base, {"q": live_id}).content.decode()
    assert live_id in page
    assert dead_id not in page
    detail = client.get(f"{base}{dead_id}/change/").content.decode()
    assert "fatal: no order nowhere" in detail
    assert "&quot;number&quot;: &quot;nowhere&quot;" in detail  # the payload, shown
    assert 'name="_save"' not in detail  # and never editable

    response = client.post(base, {"action": "retry_dead_letters", "_selected_action": [dead_id, live_id]})
    assert response.status_code == 302
    assert sorted(job_rows(alias)) == [("shop.confirm_order", "queued", 0)] * 2
    run_worker()  # fails again: a dead letter once more
    response = client.post(base, {"action": "purge_dead_letters", "_selected_action": [dead_id, live_id]})
    assert response.status_code == 302
    assert QueuedJob.objects.using(alias).filter(id=dead_id).count() == 0
    assert QueuedJob.objects.using(alias).filter(id=live_id).count() == 1  # not a dead letter: kept


def test_the_admin_cancels_waiting_jobs_and_shows_progress(alias: str) -> None:
    queue = sj.get_queue()
    waiting = queue.dispatch(jobs.ConfirmOrder(number="later", database=alias), delay=3600)
    dead = queue.dispatch(jobs.ConfirmOrder(number="nowhere", database=alias))
    run_worker()
    report = Progress(3, 10, "three <b>")
    QueuedJob.objects.using(alias).filter(id=waiting).update(progress=report.to_json())
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    base = "/admin/syncjobs/queuedjob/"
    page = client.get(base).content.decode()
    assert "3 of 10 (30%) three &lt;b&gt;" in page
    response = client.post(base, {"action": "cancel_jobs", "_selected_action": [waiting, dead]}, follow=True)
    assert "1 job(s) cancelled" in response.content.decode()
    assert sorted(job_rows(alias)) == [("shop.confirm_order", "cancelled", 0), ("shop.confirm_order", "dead", 1)]
    status = queue.status(waiting)
    assert status is not None
    assert status.state == "cancelled"


def test_the_admin_lists_finished_jobs_with_their_result_and_progress(alias: str) -> None:
    handle = jobs.measure.dispatch("<script>alert(1)</script>")
    run_worker()
    assert handle.result(0) == {"label": "<script>alert(1)</script>"}
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    base = "/admin/syncjobs/finishedjob/"
    page = client.get(base).content.decode()
    assert handle in page
    assert "2 of 4 (50%) halfway" in page
    detail = client.get(f"{base}{handle}/change/").content.decode()
    assert detail.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 2  # its payload and its result, escaped
    assert "<script>alert(1)" not in detail
    change_link = f"{base}{handle}/change/"
    assert change_link in client.get(base, {"q": handle}).content.decode()
    assert change_link not in client.get(base, {"q": str(uuid.uuid4())}).content.decode()
    # A record past its keep is gone, for the admin as for status(), before the workers prune it.
    FinishedJob.objects.using(alias).filter(id=handle).update(expires_at=time.time() - 1)
    assert change_link not in client.get(base).content.decode()
    assert handle.status() is None


@sj.register
@dataclasses.dataclass
class Reindex(syncjobs.Job):
    NAME = "tests.django.reindex"
    UNIQUE = syncjobs.Unique("user_id")
    user_id: int

    def run(self) -> None:
        pass


def test_a_unique_job_dispatched_in_atomic_blocks_is_one_job(alias: str) -> None:
    """Django's MySQL connections count the rows an upsert matched, not those it changed."""
    with transaction.atomic(using=alias):
        first = sj.dispatch(Reindex(1))
        assert sj.dispatch(Reindex(1)) == first
    with transaction.atomic(using=alias):
        again = sj.dispatch(Reindex(1))
    assert again == first
    assert again.duplicate
    assert [row for row in job_rows(alias) if row[0] == Reindex.NAME] == [(Reindex.NAME, "queued", 0)]


def test_a_schedule_runs_in_the_worker_queues_of_the_queue_it_names_and_the_admin_lists_it(alias: str) -> None:
    beats = f"beats-{uuid.uuid4().hex[:8]}"  # a queue of its own: no other test's workers run this schedule
    sj.schedule("tests.django.beat", jobs.ConfirmOrder(number="none", database=alias), queue=beats, every=1)
    [queue] = sj.worker_queues([beats], workers=1)
    assert [s.name for s in queue.schedules()] == ["tests.django.beat"]
    [default] = sj.worker_queues(["default"], workers=1)
    try:
        assert default.schedules() == []  # only the queue it names
    finally:
        default.shutdown()
    with queue:
        deadline = time.monotonic() + 10
        while not ScheduleRecord.objects.using(alias).filter(queue=beats).exists():
            assert time.monotonic() < deadline, "no slot dispatched"
            queue.wait_finished(0.05)
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    page = client.get("/admin/syncjobs/schedulerecord/", {"queue": beats}).content.decode()
    assert "tests.django.beat" in page
    assert "every 1s" in page


def test_dead_letter_callbacks_reach_the_worker_commands_queues(alias: str) -> None:
    jobs.DEAD_LETTERS.clear()
    sj.dispatch(jobs.ConfirmOrder(number="nowhere", database=alias))
    run_worker()
    assert jobs.DEAD_LETTERS == [("shop.confirm_order", "fatal: no order nowhere")]


def test_dead_letter_callbacks_reach_the_memory_backends_queues() -> None:
    jobs.DEAD_LETTERS.clear()
    with override_settings(SYNCJOBS={"BACKEND": "memory", "WORKERS": 1, "QUEUES": ["default"]}):
        sj.dispatch(jobs.ConfirmOrder(number="nowhere", database="default"), queue="other")
        assert sj.get_queue("other").join(timeout=10)
    assert jobs.DEAD_LETTERS == [("shop.confirm_order", "fatal: no order nowhere")]


# -- the Django Tasks backend ------------------------------------------------------------

#: The job name of the shop's ``add`` task: its path.
ADD = f"{jobs.__name__}.add"


def test_tasks_enqueue_run_and_answer_get_result(alias: str) -> None:
    seen: list[tuple[str, str]] = []

    def record(signal_name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((signal_name, task_result.status))

        return receiver

    receivers = [
        (signal, record(name))
        for name, signal in [("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)]
    ]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:
        result = jobs.add.enqueue(2, 3)
        assert result.status == TaskResultStatus.READY
        assert not result.is_finished
        with pytest.raises(ValueError, match="not finished"):
            result.return_value  # noqa: B018
        queued = jobs.add.get_result(result.id)
        assert (queued.status, queued.args, queued.kwargs, queued.attempts) == (TaskResultStatus.READY, [2, 3], {}, 0)
        # The job is the task: its path in logs, stats and the admin, the TaskResult's id its id.
        assert job_rows(alias) == [(ADD, "queued", 0)]
        assert QueuedJob.objects.using(alias).get(id=result.id).name == ADD
        run_worker()
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    fetched = jobs.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == 5
    assert (fetched.args, fetched.kwargs) == ([2, 3], {})
    assert fetched.attempts == 1
    assert fetched.enqueued_at <= fetched.started_at <= fetched.finished_at
    assert abs(fetched.enqueued_at - result.enqueued_at) < datetime.timedelta(seconds=1)  # type: ignore[operator]
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert seen == [("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")]
    # Kept as the job's record (not in a table of the backend's own), arguments and all.
    assert job_rows(alias) == []
    finished = FinishedJob.objects.using(alias).get(id=result.id)
    assert (finished.name, json.loads(finished.payload), json.loads(finished.result or "")) == (
        ADD,
        {"args": [2, 3], "kwargs": {}},
        5,
    )
    assert not TaskResultRecord.objects.using(alias).exists()


def test_tasks_on_the_memory_backend_answer_get_result_from_their_queue() -> None:
    with override_settings(SYNCJOBS={"BACKEND": "memory", "WORKERS": 1, "QUEUES": ["default", "reports"]}):
        summed = jobs.add.enqueue(20, 22)
        report = jobs.monthly_report.enqueue()
        assert sj.get_queue("default").result(summed.id, timeout=10) == 42
        assert sj.get_queue("reports").result(report.id, timeout=10) == {"orders": 0, "ok": True}
        fetched = jobs.add.get_result(summed.id)
        assert (fetched.status, fetched.return_value, fetched.args) == (TaskResultStatus.SUCCESSFUL, 42, [20, 22])
        assert jobs.monthly_report.get_result(report.id).task.queue_name == "reports"


def test_a_task_enqueued_in_an_open_transaction_has_a_result_at_once(alias: str) -> None:
    with transaction.atomic(using=alias):
        result = jobs.add.enqueue(2, 2)
        waiting = jobs.add.get_result(result.id)
        assert (waiting.status, waiting.args) == (TaskResultStatus.READY, [2, 2])
    run_worker()
    assert jobs.add.get_result(result.id).return_value == 4


def test_a_failed_tasks_error_keeps_a_message_of_many_lines_apart_from_its_traceback(alias: str) -> None:
    from tests.django_project.shop import reports

    result = reports.fail_in_lines.enqueue("second line")
    run_worker()
    [error] = reports.fail_in_lines.get_result(result.id).errors
    assert error.exception_class is RuntimeError
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert error.traceback.endswith("RuntimeError: first line\nsecond line\n")


def test_without_use_tz_a_tasks_times_are_naive_like_djangos() -> None:
    settings_ = {"BACKEND": "memory", "WORKERS": 1, "QUEUES": ["default"]}
    with override_settings(USE_TZ=False, SYNCJOBS=settings_):
        result = jobs.add.enqueue(1, 1)
        assert sj.get_queue().result(result.id, timeout=10) == 2
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        moments = [result.enqueued_at, result.started_at, result.finished_at, result.last_attempted_at]
        assert all(moment is not None and timezone.is_naive(moment) for moment in moments), moments
        assert abs(timezone.now() - result.finished_at) < datetime.timedelta(minutes=1)  # type: ignore[operator]


def test_the_admin_finds_a_task_by_its_result_id_with_its_path_and_arguments(alias: str) -> None:
    result = jobs.add.enqueue(7, 8)
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    for base in ("/admin/syncjobs/queuedjob/", "/admin/syncjobs/finishedjob/"):  # queued, then finished
        page = client.get(base, {"q": result.id}).content.decode()
        assert f"{base}{result.id}/change/" in page
        assert ADD in page
        detail = client.get(f"{base}{result.id}/change/").content.decode()
        assert "&quot;args&quot;: [\n    7,\n    8\n  ]" in detail
        run_worker()
    assert jobs.add.get_result(result.id).return_value == 15


def test_a_tasks_result_is_gone_after_keep_result(alias: str) -> None:
    with override_settings(SYNCJOBS={**settings.SYNCJOBS, "KEEP_RESULT": 0}):
        result = jobs.add.enqueue(1, 2)
        run_worker()
        with pytest.raises(TaskResultDoesNotExist):
            jobs.add.get_result(result.id)


def test_results_of_the_earlier_task_results_table_stay_readable_and_its_jobs_run(alias: str) -> None:
    """What an earlier syncjobs wrote (a row in syncjobs_task_results, a job named syncjobs.django.task)."""
    record = TaskResultRecord.objects.using(alias).create(
        id="legacy-1", backend="default", task_path=ADD, queue_name="default", args=[20, 22], kwargs={}
    )
    assert jobs.add.get_result(record.id).status == TaskResultStatus.READY
    sj.dispatch(RunTask(backend="default", result_id=record.id, database=alias))
    run_worker()
    fetched = jobs.add.get_result(record.id)
    assert (fetched.status, fetched.return_value, fetched.args) == (TaskResultStatus.SUCCESSFUL, 42, [20, 22])
    # Delivered again (at-least-once: a lost lease, a failed delete): the finished result stands.
    RunTask(backend="default", result_id=record.id, database=alias).run()
    again = jobs.add.get_result(record.id)
    assert (again.status, again.attempts, again.finished_at) == (TaskResultStatus.SUCCESSFUL, 1, fetched.finished_at)


def test_a_cancelled_task_is_failed_with_the_cancel_as_its_error(alias: str) -> None:
    result = jobs.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1, 1)
    assert sj.get_queue().cancel(result.id)
    fetched = jobs.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    [error] = fetched.errors
    assert error.exception_class is JobCancelled


def test_only_a_task_is_found_by_its_path() -> None:
    from syncjobs.contrib.django.tasks import find_task_job, job_class_for

    assert find_task_job(ADD) is job_class_for(jobs.add)
    assert find_task_job(f"{jobs.__name__}.ConfirmOrder") is None, "a class job is not a task"
    assert find_task_job("os.path.join") is None, "nor is any other importable name"
    assert find_task_job("tests.django_project.shop.no_such_module.task") is None
    assert find_task_job("tests.django_project.shop.reports.no_such_task") is None
    assert find_task_job("undotted") is None


def test_a_worker_that_never_imported_a_tasks_module_finds_the_task_by_its_path() -> None:
    from tests.django_project.shop import reports

    result = reports.count_words.enqueue("one two three")
    sent = reports.shout.using(backend="default").enqueue("hey")
    # A worker process whose startup imports no module of the task's.
    code = textwrap.dedent(
        f"""
        import sys
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["syncjobs.contrib.django"],
            DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}}}},
            SYNCJOBS={{"DATABASE": "default", "WORKERS": 1}},
            TASKS={{
                "default": {{"BACKEND": "syncjobs.contrib.django.tasks.SyncJobsBackend"}},
                "immediate": {{"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}},
            }},
            USE_TZ=True,
        )
        django.setup()
        import syncjobs.contrib.django as sj

        assert "{reports.__name__}" not in sys.modules
        [queue] = sj.worker_queues(["default"])
        with queue:
            print(queue.result("{result.id}", timeout=30), queue.result("{sent.id}", timeout=30))
        """
    )
    database = str(connections["default"].settings_dict["NAME"])
    root = Path(__file__).parents[2]
    command = [sys.executable, "-c", code, database]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60, cwd=root)
    assert (done.returncode, done.stdout.strip()) == (0, "3 HEY"), done.stderr
    fetched = reports.count_words.get_result(result.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 3)


def test_every_installed_apps_jobs_module_is_found_when_django_starts(tmp_path: Path) -> None:
    # A lean process: Django's setup and nothing else (no URLconf, no views, no checks).
    code = textwrap.dedent(
        """
        import sys
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["syncjobs.contrib.django", "tests.django_project.shop"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
            SYNCJOBS={"DATABASE": "default"},
            TASKS={
                "default": {
                    "BACKEND": "syncjobs.contrib.django.tasks.SyncJobsBackend",
                    "QUEUES": ["default", "reports"],
                },
            },
        )
        assert "tests.django_project.shop.jobs" not in sys.modules
        django.setup()
        import syncjobs.contrib.django as sj

        print(" ".join(sj.get_queue().registered_names()))
        """
    )
    root = Path(__file__).parents[2]
    command = [sys.executable, "-c", code, str(tmp_path / "db.sqlite3")]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 0, done.stderr
    names = done.stdout.split()
    assert {"shop.confirm_order", "cli.sleepy", "cli.stubborn"} <= set(names), names


def test_manage_py_check_warns_of_a_task_queue_no_worker_serves(tmp_path: Path) -> None:
    # A project that imports nothing of django.tasks itself: the check must still run.
    code = textwrap.dedent(
        """
        import sys
        import django
        from django.conf import settings
        from django.core.management import call_command

        settings.configure(
            INSTALLED_APPS=["syncjobs.contrib.django"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
            SYNCJOBS={"DATABASE": "default", "QUEUES": ["default"]},
            TASKS={
                "default": {
                    "BACKEND": "syncjobs.contrib.django.tasks.SyncJobsBackend",
                    "QUEUES": ["default", "reports"],
                },
            },
        )
        django.setup()
        call_command("check")
        """
    )
    root = Path(__file__).parents[2]
    command = [sys.executable, "-c", code, str(tmp_path / "db.sqlite3")]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 0, done.stderr
    assert "(syncjobs.W001) task queue(s) 'reports' of TASKS['default'] are not in settings.SYNCJOBS QUEUES" in (
        done.stderr
    )


def test_a_mistake_in_the_settings_is_a_check_error_and_one_line_from_the_worker(tmp_path: Path) -> None:
    (tmp_path / "typo_settings.py").write_text(
        'from tests.django_project.settings import *  # noqa: F403\nSYNCJOBS = {"DATABASES": "default"}\n'
    )
    root = str(Path(__file__).parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([root, str(tmp_path)]),
        "DJANGO_SETTINGS_MODULE": "typo_settings",
    }

    def django(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "django", *args]
        return subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=60, check=False)

    checked = django("check")
    assert checked.returncode == 1
    assert "(syncjobs.E002) settings.SYNCJOBS has unknown key(s) 'DATABASES'" in checked.stderr
    assert 'HINT: What each key takes is in "Using with Django"' in checked.stderr
    worker = django("syncjobs_worker", "--skip-checks")
    assert worker.returncode == 1
    assert worker.stderr.strip().splitlines() == [
        "CommandError: settings.SYNCJOBS has unknown key(s) 'DATABASES'; known: " + ", ".join(conf.KNOWN_KEYS)
    ]
    # The operators' command runs no system checks: the mistake is its one line.
    stats = django("syncjobs", "stats")
    assert stats.returncode == 1
    assert stats.stderr.strip().splitlines() == [
        "manage.py syncjobs stats: error: settings.SYNCJOBS has unknown key(s) 'DATABASES'; known: "
        + ", ".join(conf.KNOWN_KEYS)
    ]


def test_a_failing_task_is_failed_with_its_error(alias: str) -> None:
    result = jobs.explode.enqueue("boom")
    run_worker()
    fetched = jobs.explode.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="failed"):
        fetched.return_value  # noqa: B018
    [error] = fetched.errors
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert "ValueError: boom" in error.traceback
    # Not retried (Django's Tasks have no retry policy); a dead letter for the operator, named by the task.
    assert job_rows(alias) == [(f"{jobs.__name__}.explode", "dead", 1)]
    dead = QueuedJob.objects.using(alias).get(id=result.id)
    assert (dead.error or "").startswith("fatal: builtins.ValueError: boom\nTraceback (most recent call last):")


def test_retrying_a_failed_task_from_the_admin_runs_the_task_again(alias: str) -> None:
    result = jobs.confirm_existing.enqueue("R-1")
    run_worker()
    assert jobs.confirm_existing.get_result(result.id).status == TaskResultStatus.FAILED
    [dead_id] = QueuedJob.objects.using(alias).filter(state="dead").values_list("id", flat=True)

    Order.objects.using("default").create(number="R-1")  # what it lacked (the task reads "default")
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    form = {"action": "retry_dead_letters", "_selected_action": [dead_id]}
    response = client.post("/admin/syncjobs/queuedjob/", form)
    assert response.status_code == 302
    run_worker()

    fetched = jobs.confirm_existing.get_result(result.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, "R-1")
    # A dead letter retried starts afresh: the runs since, no earlier error.
    assert (fetched.attempts, fetched.errors) == (1, [])
    assert Order.objects.get(number="R-1").confirmed
    assert job_rows(alias) == []


def test_run_after_defers_the_task(alias: str) -> None:
    later = timezone.now() + datetime.timedelta(hours=1)
    result = jobs.add.using(run_after=later).enqueue(1, 1)
    run_worker()  # --burst leaves what is not due yet
    fetched = jobs.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    # The job's due time, as the database keeps it (seconds, as a float): within a moment of the asked.
    assert fetched.task.run_after is not None
    assert abs(fetched.task.run_after - later) < datetime.timedelta(seconds=1)
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT run_at FROM syncjobs_jobs")
        [(run_at,)] = cursor.fetchall()
    assert run_at == pytest.approx(later.timestamp(), abs=5)


def test_context_async_tasks_and_other_queues() -> None:
    with override_settings(SYNCJOBS={"DATABASE": "default", "QUEUES": ["default", "reports"]}):
        attempt = jobs.which_attempt.enqueue()
        doubled = asyncio.run(jobs.double_later.aenqueue(21))
        report = jobs.monthly_report.enqueue()
        run_worker("--queue", "default", "--queue", "reports")
        assert jobs.which_attempt.get_result(attempt.id).return_value == 1
        assert asyncio.run(jobs.double_later.aget_result(doubled.id)).return_value == 42
        assert jobs.monthly_report.get_result(report.id).return_value == {"orders": 0, "ok": True}
        assert report.task.queue_name == "reports"


def test_tasks_of_a_higher_priority_run_first() -> None:
    backend = jobs.add.get_backend()
    assert backend.supports_priority is True
    plain = [jobs.add.enqueue(n, 0) for n in range(3)]
    urgent = jobs.urgent_add.enqueue(1, 1)  # @task(priority=10)
    lowly = jobs.add.using(priority=-50).enqueue(5, 5)
    raised = jobs.add.using(priority=50).enqueue(2, 2)
    assert (urgent.task.priority, lowly.task.priority, raised.task.priority) == (10, -50, 50)
    assert QueuedJob.objects.get(id=raised.id).priority == 50
    run_worker("--workers", "1")  # one thread: tasks start in the order they were claimed
    results = [jobs.add.get_result(raised.id), jobs.urgent_add.get_result(urgent.id)]
    results += [jobs.add.get_result(r.id) for r in (*plain, lowly)]
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 6
    assert (results[0].task.priority, results[1].task.priority, results[-1].task.priority) == (50, 10, -50)
    started = [r.started_at for r in results]
    assert all(at is not None for at in started)
    assert started == sorted(started), started  # 50, then 10, then the three of 0 in order, then -50


def test_what_the_backend_refuses() -> None:
    backend = jobs.add.get_backend()
    assert (backend.supports_defer, backend.supports_get_result, backend.supports_async_task) == (True, True, True)
    # TASKS lists a "reports" queue that SYNCJOBS["QUEUES"] does not: the check says so.
    [warning] = backend.check()
    assert warning.id == "syncjobs.W001"
    assert "'reports'" in warning.msg
    with pytest.raises(InvalidTask, match="priority"):
        jobs.add.using(priority=101)  # Django's range: -100 to 100
    with pytest.raises(InvalidTask, match="Queue 'nightly' is not valid"):
        jobs.add.using(queue_name="nightly")
    with pytest.raises(InvalidTask, match="module level"):

        @task
        def local() -> None:  # pragma: no cover - never runs
            pass

    with pytest.raises(InvalidTask, match="aware datetime"):
        jobs.add.using(run_after=datetime.datetime(2030, 1, 1))
    with pytest.raises(TypeError, match="Unsupported type"):
        jobs.add.enqueue(object(), 1)
    assert not QueuedJob.objects.exists()  # nothing enqueued for what was refused
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result("no-such-id")
    other = jobs.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        jobs.explode.get_result(other.id)


def test_the_worker_command_logs_json_lines(alias: str, capfd: pytest.CaptureFixture[str]) -> None:
    result = jobs.add.enqueue(4, 4)
    run_worker("--log-format", "json")
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    outcomes = [line for line in lines if line["logger"] == "syncjobs.worker" and "job_name" in line]
    assert len(outcomes) == 1, lines
    done = outcomes[0]
    assert done["outcome"] == "done"
    assert re.fullmatch(r"[0-9a-f-]{36}", done["job_id"])
    assert jobs.add.get_result(result.id).return_value == 8


# -- syncjobs connects as Django does ------------------------------------------------------


def database(alias: str) -> str:
    if alias not in settings.DATABASES:
        pytest.skip(f"{alias} is not reachable")
    return alias


def like(alias: str, **overrides: Any) -> BaseDatabaseWrapper:
    """A Django connection to ``alias``'s (test) database, with ``overrides`` in its settings."""
    wrapper: BaseDatabaseWrapper = type(connections[alias])({**connections[alias].settings_dict, **overrides}, alias)
    return wrapper


def dispatch_through(connection: BaseDatabaseWrapper) -> str:
    """Dispatch one job on syncjobs' own connection, made as the integration makes it."""
    url, connect_args = conf.connection_params(connection)
    queue = syncjobs.DatabaseJobQueue(
        url, connect_args=connect_args, workers=0, table=conf.TABLE, auto_schema=False, dispatch_timeout=2
    )
    queue.register(jobs.ConfirmOrder)
    try:
        return queue.dispatch(jobs.ConfirmOrder(number="C-1", database=connection.alias))
    finally:
        queue.shutdown()


def test_postgresql_over_a_unix_socket(tmp_path: Path) -> None:
    alias = database("postgresql")
    # The machine's server listens on TCP only: a socket of the test's own leads there.
    with Forwarder.unix(str(tmp_path / ".s.PGSQL.5432"), ("127.0.0.1", 5432)) as forwarder:
        connection = like(alias, HOST=str(tmp_path), PORT="5432")
        dispatch_through(connection)
        assert forwarder.accepted >= 1
    assert job_rows(alias) == [("shop.confirm_order", "queued", 0)]
    url, _ = conf.connection_params(connection)
    name = connections[alias].settings_dict["NAME"]  # the test database
    assert url == f"postgresql://postgres@{quote(str(tmp_path), safe='')}:5432/{name}"


def test_postgresql_over_ipv6() -> None:
    alias = database("postgresql")
    try:
        forwarder = Forwarder.tcp("::1", ("127.0.0.1", 5432))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with forwarder:
        dispatch_through(like(alias, HOST="::1", PORT=str(forwarder.listener.getsockname()[1])))
        assert forwarder.accepted >= 1
    assert job_rows(alias) == [("shop.confirm_order", "queued", 0)]


def test_postgresql_options_such_as_sslmode_apply() -> None:
    alias = database("postgresql")
    connection = like(alias, OPTIONS={"sslmode": "require"})
    _, connect_args = conf.connection_params(connection)
    assert connect_args["sslmode"] == "require"
    # This server has no TLS: Django refuses to connect without it, and so does syncjobs.
    with pytest.raises(Exception, match="SSL"):
        connection.ensure_connection()
    with pytest.raises(syncjobs.QueueError) as refused:  # the driver's error chained
        dispatch_through(connection)
    assert "server does not support SSL, but SSL was required" in chain(refused.value)
    assert job_rows(alias) == []


def test_mysql_over_its_unix_socket() -> None:
    alias = database("mysql")
    sock = "/run/mysqld/mysqld.sock"
    if not os.path.exists(sock):
        pytest.skip(f"no MySQL/MariaDB socket at {sock}")
    # A port nothing listens on: only the socket can have carried it.
    dispatch_through(like(alias, HOST=sock, PORT="1"))
    assert job_rows(alias) == [("shop.confirm_order", "queued", 0)]


def chain(exc: BaseException | None) -> str:
    """Every message of ``exc`` and its causes."""
    messages = []
    while exc is not None:
        messages.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return " | ".join(messages)


def test_mysql_options_such_as_ssl_apply(tmp_path: Path) -> None:
    alias = database("mysql")
    missing = str(tmp_path / "no-such-ca.pem")
    connection = like(alias, OPTIONS={"ssl": {"ca": missing}})
    _, connect_args = conf.connection_params(connection)
    assert connect_args["ssl"] == {"ca": missing}
    assert "conv" not in connect_args  # Django's converters stay Django's
    # The CA file is read as Django's own connection reads it.
    with pytest.raises(FileNotFoundError):
        connection.ensure_connection()
    with pytest.raises(FileNotFoundError):
        dispatch_through(connection)
    assert job_rows(alias) == []


MEMORY_BACKEND_AT_EXIT = textwrap.dedent(
    """
    import dataclasses, threading
    import django
    django.setup()
    import syncjobs
    import syncjobs.contrib.django as sj

    started = threading.Event()

    @sj.register
    @dataclasses.dataclass
    class Slow(syncjobs.Job):
        NAME = "script.slow"

        def run(self):
            started.set()
            if syncjobs.current_job().cancelled.wait(1.0):
                print("cancelled", flush=True)
                raise syncjobs.Cancelled()
            print("finished", flush=True)

    sj.dispatch(Slow())
    assert started.wait(30)
    # The main thread ends with the job running: it gets its grace.
    """
)


def test_the_memory_backend_gives_running_jobs_their_grace_at_exit(tmp_path: Path) -> None:
    (tmp_path / "memory_settings.py").write_text(
        "from tests.django_project.settings import *  # noqa: F403\n"
        'SYNCJOBS = {"BACKEND": "memory", "WORKERS": 1, "SHUTDOWN_GRACE": 30}\n'
    )
    root = str(Path(__file__).parents[2])
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_BACKEND_AT_EXIT],
        capture_output=True,
        text=True,
        cwd=root,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([root, str(tmp_path)]),
            "DJANGO_SETTINGS_MODULE": "memory_settings",
        },
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "finished\n", proc.stderr
    assert "still pending in an in-memory queue" not in proc.stderr
