"""A Django Tasks backend (``django.tasks``, Django 6.0+) on syncjobs.

.. code-block:: python

    TASKS = {"default": {"BACKEND": "syncjobs.contrib.django.tasks.SyncJobsBackend"}}

``@task`` functions run on syncjobs' workers (``manage.py syncjobs_worker``);
results live in the ``syncjobs_task_results`` table, so ``get_result()``
answers from any process. A task that raises is FAILED, with its error, and
is not retried (Django's Tasks have no retry policy); a run cut short by a
dying worker or a shutdown runs again, and counts as another attempt.
"""

from __future__ import annotations

import dataclasses
from traceback import format_exception
from typing import Any

from django.db import transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskContext, TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.crypto import get_random_string
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from ...context import current_job
from ...errors import Cancelled, Fatal
from ...ids import new_job_id
from ...job import Job
from . import conf, dispatch
from .models import TaskResultRecord

# TaskResultStatus values, as the results table stores them.
READY, RUNNING, FAILED, SUCCESSFUL = "READY", "RUNNING", "FAILED", "SUCCESSFUL"

#: Names this process in a result's ``worker_ids``.
WORKER_ID = get_random_string(32)


class SyncJobsBackend(BaseTaskBackend):
    supports_defer = True  # run_after: the job waits in the table until then
    supports_async_task = True  # coroutine functions run through async_to_sync
    supports_get_result = True  # from the results table, in any process
    supports_priority = False  # jobs are claimed in the order they come due

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        self.validate_task(task)
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=new_job_id(),
            status=TaskResultStatus(READY),
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,  # normalized to JSON types here, or TypeError
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        delay = 0.0
        if task.run_after is not None:
            delay = max(0.0, (task.run_after - timezone.now()).total_seconds())
        database = conf.read().results_database
        # The result row and the job in one transaction where they share a
        # database: neither exists without the other.
        with transaction.atomic(using=database):
            TaskResultRecord.objects.using(database).create(
                id=result.id,
                backend=self.alias,
                task_path=task.module_path,
                queue_name=task.queue_name,
                priority=task.priority,
                takes_context=task.takes_context,
                run_after=task.run_after,
                args=result.args,
                kwargs=result.kwargs,
                enqueued_at=result.enqueued_at,
            )
            dispatch(
                RunTask(backend=self.alias, result_id=result.id, database=database),
                delay=delay,
                queue=task.queue_name,
                using=database,
            )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        database = conf.read().results_database
        try:
            record = TaskResultRecord.objects.using(database).get(id=result_id)
        except TaskResultRecord.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        return _task_result(record)

    def check(self, **kwargs: Any) -> list[Any]:
        from django.apps import apps  # noqa: PLC0415 - only when checks run
        from django.core import checks  # noqa: PLC0415

        if not apps.is_installed("syncjobs.contrib.django"):
            return [
                checks.Error(
                    "the syncjobs Tasks backend keeps its results in a table of the syncjobs app",
                    hint='Add "syncjobs.contrib.django" to INSTALLED_APPS and run migrate.',
                    id="syncjobs.E001",
                )
            ]
        served = conf.read().queues
        unserved = sorted(set(self.queues) - set(served))
        if unserved:
            return [
                checks.Warning(
                    f"task queue(s) {', '.join(map(repr, unserved))} of TASKS[{self.alias!r}] are not in "
                    f"settings.SYNCJOBS QUEUES, so syncjobs_worker does not serve them by default",
                    hint="Add them to SYNCJOBS QUEUES, or run syncjobs_worker with --queue for each.",
                    id="syncjobs.W001",
                )
            ]
        return []


def _task_result(record: TaskResultRecord) -> TaskResult[Any, Any]:
    task = import_string(record.task_path)
    if not isinstance(task, Task):
        raise TaskResultDoesNotExist(f"{record.task_path!r} is no longer a task")
    task = dataclasses.replace(
        task, queue_name=record.queue_name, priority=record.priority, run_after=record.run_after, backend=record.backend
    )
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=record.id,
        status=TaskResultStatus(record.status),
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at,
        args=record.args,
        kwargs=record.kwargs,
        backend=record.backend,
        errors=[TaskError(**error) for error in record.errors],
        worker_ids=list(record.worker_ids),
    )
    object.__setattr__(result, "_return_value", record.return_value)
    return result


@dataclasses.dataclass
class RunTask(Job):
    """The syncjobs job that runs one enqueued Django task and records its result."""

    NAME = "syncjobs.django.task"
    backend: str
    result_id: str
    database: str

    def run(self) -> None:
        records = TaskResultRecord.objects.using(self.database)
        try:
            record = records.get(id=self.result_id)
        except TaskResultRecord.DoesNotExist:
            raise Fatal(f"task result {self.result_id} is gone") from None
        if self._finished_before(record):
            return  # delivered again (at-least-once) after it finished: its result stands
        try:
            task = import_string(record.task_path)
        except ImportError as exc:
            raise Fatal(f"task {record.task_path!r} cannot be imported: {exc}") from exc
        now = timezone.now()
        record.status = RUNNING
        record.finished_at = None
        record.return_value = None
        record.started_at = record.started_at or now
        record.last_attempted_at = now
        record.worker_ids = [*record.worker_ids, WORKER_ID]
        record.save(using=self.database)
        result = _task_result(record)
        task_started.send(SyncJobsBackend, task_result=result)
        try:
            if record.takes_context:
                value = task.call(TaskContext(task_result=result), *record.args, **record.kwargs)
            else:
                value = task.call(*record.args, **record.kwargs)
            value = normalize_json(value)
        except Cancelled:
            # Shutdown: the run is handed back and will run again.
            record.status = READY
            record.save(using=self.database)
            raise
        except BaseException as exc:
            self._finish(record, FAILED, errors=[_error(exc)])
            raise Fatal(f"task {record.task_path} raised {type(exc).__name__}: {exc}") from exc
        self._finish(record, SUCCESSFUL, return_value=value)

    @staticmethod
    def _finished_before(record: TaskResultRecord) -> bool:
        """The result of a run of this very job stands; a dead letter queued again runs the task again.

        A task that raised made its job a dead letter; retrying that (the
        admin's action, ``syncjobs dead retry``) gives the job fresh attempts,
        so it runs at attempt 0, which only a first delivery otherwise does,
        and a first delivery finds the result READY. A later attempt over a
        finished result is the same run delivered again.
        """
        if record.status == SUCCESSFUL:
            return True
        info = current_job()
        return record.status == FAILED and (info is None or info.attempt > 0)

    def _finish(self, record: TaskResultRecord, status: str, **fields: Any) -> None:
        record.status = status
        record.finished_at = timezone.now()
        for name, value in fields.items():
            setattr(record, name, value if name != "errors" else [*record.errors, *value])
        record.save(using=self.database)
        task_finished.send(SyncJobsBackend, task_result=_task_result(record))


def _error(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(format_exception(exc)),
    }
