"""A Django Tasks backend (``django.tasks``, Django 6.0+) on syncjobs.

.. code-block:: python

    TASKS = {"default": {"BACKEND": "syncjobs.contrib.django.tasks.SyncJobsBackend"}}

``@task`` functions run on syncjobs' workers (``manage.py syncjobs_worker``).
Each enqueued task is a syncjobs job named by the task's path
(``shop.tasks.send_receipt``) whose payload is its arguments, so it shows as
itself in logs, ``syncjobs stats``, dead letters and the admin, and the
TaskResult's id is the job's id. ``get_result()`` reads the job's status and
result, from any process: a finished task's is kept ``KEEP_RESULT`` seconds
(``settings.SYNCJOBS``, ten minutes by default), then
``TaskResultDoesNotExist``.

A task that raises is FAILED, with its error and traceback, and is not
retried (Django's Tasks have no retry policy): it is a dead letter, which an
operator may retry (it then starts afresh, its earlier error left to the
log). A run cut short by a dying worker or a shutdown runs again, and counts
as another attempt. Results written by an earlier syncjobs, in the
``syncjobs_task_results`` table, stay readable, and jobs it queued still run.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from traceback import format_exception
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskContext, TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.crypto import get_random_string
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from ...context import current_job
from ...database.admin import status_from_row
from ...errors import Cancelled, Fatal, QueueError
from ...function_tasks import FunctionJob
from ...ids import created_at
from ...job import Job
from ...status import JobStatus, utc
from . import conf, dispatch, get_queue, register
from .models import QueuedJob, TaskResultRecord

# TaskResultStatus values, as the results table stores them.
READY, RUNNING, FAILED, SUCCESSFUL = "READY", "RUNNING", "FAILED", "SUCCESSFUL"

#: Names this process in a result's ``worker_ids`` (results of the earlier table).
WORKER_ID = get_random_string(32)

#: syncjobs records how many runs a job began, not which worker ran each: a
#: TaskResult's ``worker_ids`` (whose length is its ``attempts``) holds this once per run.
RUN_BY = "syncjobs"

#: What a job's state is to a TaskResult: a job waiting to run again is READY.
_STATUSES = {
    "queued": READY,
    "scheduled": READY,
    "retrying": READY,
    "running": RUNNING,
    "done": SUCCESSFUL,
    "dead": FAILED,
    "cancelled": FAILED,
}


class SyncJobsBackend(BaseTaskBackend):
    supports_defer = True  # run_after: the job waits in the queue until then
    supports_async_task = True  # coroutine functions run through async_to_sync
    supports_get_result = True  # from the job's status, in any process
    supports_priority = True  # of the jobs due, those of higher priority are claimed first

    def validate_task(self, task: Task[Any, Any]) -> None:
        super().validate_task(task)
        # Every process that defines the task can run it: Task() validates
        # itself with its backend, at import.
        try:
            register(job_class_for(task))
        except (TypeError, QueueError) as exc:  # a path too long for a NAME, or one a job class has
            raise InvalidTask(f"task {task.module_path}: {exc}") from exc

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        self.validate_task(task)
        args, kwargs = normalize_json(args), normalize_json(kwargs)  # JSON types, or TypeError: nothing enqueued
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):  # USE_TZ = False: the project's local time
            run_after = timezone.make_aware(run_after)
        job = job_class_for(task)(list(args), dict(kwargs))
        handle = dispatch(job, run_at=run_after, priority=task.priority, queue=task.queue_name)
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=str(handle),
            status=TaskResultStatus(READY),
            enqueued_at=_shown(utc(created_at(handle))),  # as get_result() reads it: the job id's time
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        found = self._status(result_id)
        if found is not None:
            status, queue_name = found
            return _from_status(status, queue_name, self.alias)
        database = conf.read().results_database
        try:  # a result of the table an earlier syncjobs kept
            record = TaskResultRecord.objects.using(database).get(id=result_id)
        except TaskResultRecord.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        return _task_result(record)

    def _status(self, result_id: str) -> tuple[JobStatus, str] | None:
        """The job's status, and the queue it is in."""
        config = conf.read()
        if config.backend != "memory":
            status = get_queue().status(result_id)  # one table: any queue reads every queue's jobs
            if status is None and config.database is not None:
                status = _uncommitted_status(config.database, result_id)
            return None if status is None else (status, status.queue or config.default_queue)
        for name in dict.fromkeys([*config.queues, *sorted(self.queues)]):  # each a queue of its own
            status = get_queue(name).status(result_id)
            if status is not None:
                return status, name
        return None

    def check(self, **kwargs: Any) -> list[Any]:
        from django.apps import apps  # noqa: PLC0415 - only when checks run
        from django.core import checks  # noqa: PLC0415

        if not apps.is_installed("syncjobs.contrib.django"):
            return [
                checks.Error(
                    "the syncjobs Tasks backend runs tasks on the queues of the syncjobs app",
                    hint='Add "syncjobs.contrib.django" to INSTALLED_APPS and run migrate.',
                    id="syncjobs.E001",
                )
            ]
        try:
            served = conf.read().queues
        except ImproperlyConfigured:
            return []  # syncjobs.E002, the check of the settings, says what is wrong
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


def _uncommitted_status(database: str, job_id: str) -> JobStatus | None:
    """The job's status as this thread's open transaction on ``database`` sees it (enqueued in it, say).

    syncjobs' own connections see only what is committed.
    """
    if not connections[database].in_atomic_block:
        return None
    columns = ("name", "state", "attempt", "max_attempts", "error", "created_at", "started_at", "finished_at")
    row = (
        QueuedJob.objects.using(database)
        .filter(id=job_id)
        .values_list(*columns, "run_at", "progress", "queue", "payload", "priority")
    )
    found = row.first()
    if found is None:
        return None
    # As queries.STATUS reads it: no result yet, and the time now.
    return status_from_row(job_id, (*found[:5], None, *found[5:10], time.time(), *found[10:]))


class TaskJob(FunctionJob):
    """One enqueued call of a Django task: its NAME is the task's path, its payload the call's arguments."""

    def run(self) -> Any:
        task = _task(self.NAME)
        info = current_job()
        runs = 1 if info is None else info.attempt + 1
        started = timezone.now()
        job_id = "" if info is None else info.id
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=job_id,
            status=TaskResultStatus(RUNNING),
            enqueued_at=_shown(utc(created_at(job_id))),
            started_at=started,
            last_attempted_at=started,
            finished_at=None,
            args=self.args,
            kwargs=self.kwargs,
            backend=task.backend,
            errors=[],
            worker_ids=[RUN_BY] * runs,
        )
        task_started.send(SyncJobsBackend, task_result=result)
        try:
            value = _call(task, result, self.args, self.kwargs)
        except Cancelled:
            raise  # a shutdown hands the run back; a cancel() ends the job cancelled
        except BaseException as exc:
            failed = dataclasses.replace(
                result, status=TaskResultStatus(FAILED), finished_at=timezone.now(), errors=[_error(exc)]
            )
            task_finished.send(SyncJobsBackend, task_result=failed)
            raise Fatal(failure(exc)) from exc
        finished = dataclasses.replace(result, status=TaskResultStatus(SUCCESSFUL), finished_at=timezone.now())
        object.__setattr__(finished, "_return_value", value)
        task_finished.send(SyncJobsBackend, task_result=finished)
        return value


def _call(task: Task[Any, Any], result: TaskResult[Any, Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run the task (with its context if it takes one); what it returns, as JSON types."""
    if task.takes_context:
        return normalize_json(task.call(TaskContext(task_result=result), *args, **kwargs))
    return normalize_json(task.call(*args, **kwargs))


_job_classes: dict[str, type[TaskJob]] = {}
_job_classes_lock = threading.Lock()


def job_class_for(task: Task[Any, Any]) -> type[TaskJob]:
    """The job class of ``task``'s calls: one per task path, made on first use."""
    path = task.module_path
    with _job_classes_lock:
        job_class = _job_classes.get(path)
        if job_class is None:
            namespace = {"NAME": path, "__module__": task.func.__module__, "__qualname__": task.func.__qualname__}
            job_class = _job_classes[path] = type(task.name, (TaskJob,), namespace)
        return job_class


def find_task_job(name: str) -> type[Job] | None:
    """For a worker that meets a task it has not imported: the job class of the task at path ``name``.

    Django's own database backend imports a task by its stored path too. Only
    a task is found; any other name finds nothing.
    """
    if "." not in name:
        return None
    try:
        found = import_string(name)
    except ImportError:
        return None
    # Any backend's task: one declared for another may be sent here with using(backend=…).
    if not isinstance(found, Task) or found.module_path != name:
        return None
    return job_class_for(found)


def _task(path: str) -> Task[Any, Any]:
    try:
        task = import_string(path)
    except ImportError as exc:
        raise Fatal(f"task {path!r} cannot be imported: {exc}") from exc
    if not isinstance(task, Task):
        raise Fatal(f"{path!r} is no longer a Django task")
    return task


def failure(exc: BaseException) -> str:
    """A failed task's error, as its dead job keeps it: ``module.Class: message``, then the traceback.

    (Raised as a :class:`Fatal`, whose ``str()`` begins ``fatal: ``.)
    """
    return f"{_class_path(exc)}: {exc}\n{''.join(format_exception(exc))}"


def _class_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


def _error(exc: BaseException) -> TaskError:
    return TaskError(exception_class_path=_class_path(exc), traceback="".join(format_exception(exc)))


def _error_of(status: JobStatus) -> TaskError:
    """A failed job's error as a TaskError: a task's own exception, or what syncjobs says ended it."""
    if status.state == "cancelled":
        return TaskError(exception_class_path="syncjobs.errors.JobCancelled", traceback="cancelled")
    text = status.error or ""
    first, traceback = text.removeprefix(f"{Fatal.kind}: "), ""
    if _TRACEBACK in first:  # written by failure(); the message may have lines of its own
        first, traceback = first.split(_TRACEBACK, 1)
    path, sep, _message = first.partition(": ")
    if sep and traceback and " " not in path and "." in path:
        return TaskError(exception_class_path=path, traceback=_TRACEBACK.lstrip("\n") + traceback)
    # Ended by syncjobs: timed out, cannot be run, its worker lost more than its attempts.
    return TaskError(exception_class_path="syncjobs.errors.JobFailed", traceback=text)


_TRACEBACK = "\nTraceback (most recent call last):"


def _shown(moment: datetime.datetime | None) -> datetime.datetime | None:
    """``moment`` as Django shows times: aware with ``USE_TZ``, else naive in the project's time zone."""
    if moment is None or settings.USE_TZ:
        return moment
    return timezone.make_naive(moment)


def _from_status(status: JobStatus, queue_name: str, alias: str) -> TaskResult[Any, Any]:
    try:
        task = import_string(status.name)
    except ImportError:
        raise TaskResultDoesNotExist(f"{status.name!r} cannot be imported") from None
    if not isinstance(task, Task):
        raise TaskResultDoesNotExist(f"{status.name!r} is not a task")
    waiting = status.state in ("queued", "scheduled", "retrying")
    run_after = _shown(status.run_at) if waiting else None
    task = dataclasses.replace(
        task, queue_name=queue_name, priority=status.priority, run_after=run_after, backend=alias
    )
    code = _STATUSES[status.state]
    runs = status.attempts + (1 if status.state == "running" else 0)
    call = status.payload if isinstance(status.payload, dict) else {}
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=status.id,
        status=TaskResultStatus(code),
        enqueued_at=_shown(status.created_at),
        started_at=_shown(status.started_at),
        finished_at=_shown(status.finished_at) if status.finished else None,
        last_attempted_at=_shown(status.started_at),
        args=call.get("args", []),
        kwargs=call.get("kwargs", {}),
        backend=alias,
        errors=[_error_of(status)] if code == FAILED else [],
        worker_ids=[RUN_BY] * runs,
    )
    if code == SUCCESSFUL:
        object.__setattr__(result, "_return_value", status.result)
    return result


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
    """How an earlier syncjobs queued a Django task: its result in ``syncjobs_task_results``.

    Still registered, so that the jobs it queued before an upgrade run, and
    their results stay readable through ``get_result()``.
    """

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
            value = _call(task, result, record.args, record.kwargs)
        except Cancelled:
            # Shutdown: the run is handed back and will run again.
            record.status = READY
            record.save(using=self.database)
            raise
        except BaseException as exc:
            self._finish(record, FAILED, errors=[_error_record(exc)])
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


def _error_record(exc: BaseException) -> dict[str, str]:
    kind = type(exc)
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(format_exception(exc)),
    }
