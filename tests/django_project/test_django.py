"""syncjobs in a real Django project, through Django's test client, admin, commands and Tasks."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import re
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections, transaction
from django.tasks import TaskResultStatus, task
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test import Client, override_settings
from django.utils import timezone

import syncjobs
import syncjobs.contrib.django as sj
from syncjobs.contrib.django.models import QueuedJob, TaskResultRecord
from syncjobs.contrib.django.tasks import RunTask
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


def test_the_worker_command_refuses_the_memory_backend() -> None:
    with (
        override_settings(SYNCJOBS={"BACKEND": "memory"}),
        pytest.raises(ImproperlyConfigured, match="memory backend: its jobs run inside the web process"),
    ):
        run_worker()


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


# -- the Django Tasks backend ------------------------------------------------------------


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
        assert jobs.add.get_result(result.id).status == TaskResultStatus.READY
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
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert seen == [("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")]
    assert TaskResultRecord.objects.using(alias).get(id=result.id).status == "SUCCESSFUL"
    # Delivered again (at-least-once: a lost lease, a failed delete): the finished result stands.
    RunTask(backend="default", result_id=result.id, database=alias).run()
    again = jobs.add.get_result(result.id)
    assert (again.status, again.attempts, again.finished_at) == (TaskResultStatus.SUCCESSFUL, 1, fetched.finished_at)


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
    # Not retried (Django's Tasks have no retry policy); a dead letter for the operator.
    assert job_rows(alias) == [("syncjobs.django.task", "dead", 1)]


def test_run_after_defers_the_task(alias: str) -> None:
    later = timezone.now() + datetime.timedelta(hours=1)
    result = jobs.add.using(run_after=later).enqueue(1, 1)
    run_worker()  # --burst leaves what is not due yet
    fetched = jobs.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    assert fetched.task.run_after == later
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


def test_what_the_backend_refuses() -> None:
    backend = jobs.add.get_backend()
    assert (backend.supports_defer, backend.supports_get_result, backend.supports_async_task) == (True, True, True)
    # TASKS lists a "reports" queue that SYNCJOBS["QUEUES"] does not: the check says so.
    [warning] = backend.check()
    assert warning.id == "syncjobs.W001"
    assert "'reports'" in warning.msg
    assert backend.supports_priority is False
    with pytest.raises(InvalidTask, match="priority"):
        jobs.add.using(priority=10)
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
    assert TaskResultRecord.objects.count() == 0  # nothing written for what was refused
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
