"""The jobs table as Django sees it (for the admin), and the Tasks backend's results."""

from __future__ import annotations

import datetime
from typing import Any

from django.db import models

from ...status import Progress


def _moment(epoch: float | None) -> datetime.datetime | None:
    return None if epoch is None else datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)


class _JobRecord(models.Model):
    """What the jobs table and its results table share; both are syncjobs' own, so unmanaged."""

    id = models.CharField(primary_key=True, max_length=64)
    queue = models.CharField(max_length=100)
    name = models.CharField(max_length=200)
    state = models.CharField(max_length=10)
    max_attempts = models.IntegerField()
    progress = models.TextField(null=True)
    created_at = models.FloatField()
    started_at = models.FloatField(null=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def created(self) -> datetime.datetime | None:
        return _moment(self.created_at)

    @property
    def started(self) -> datetime.datetime | None:
        return _moment(self.started_at)

    @property
    def reported_progress(self) -> Progress | None:
        return Progress.from_json(self.progress)


class QueuedJob(_JobRecord):
    """A row of syncjobs' jobs table (see the migrations for its schema)."""

    payload = models.TextField()
    context = models.TextField(null=True)
    attempt = models.IntegerField()
    run_at = models.FloatField()
    lease_owner = models.CharField(max_length=64, null=True)
    lease_token = models.CharField(max_length=64, null=True)
    lease_expires = models.FloatField(null=True)
    error = models.TextField(null=True)
    finished_at = models.FloatField(null=True)
    cancel_requested = models.IntegerField(null=True)
    #: Of the jobs due, higher runs first (schema version 6).
    priority = models.IntegerField(default=0)

    class Meta:
        managed = False
        db_table = "syncjobs_jobs"
        ordering = ("run_at", "id")
        verbose_name = "job"

    @property
    def due(self) -> datetime.datetime | None:
        return _moment(self.run_at)

    @property
    def finished(self) -> datetime.datetime | None:
        return _moment(self.finished_at)


class FinishedJob(_JobRecord):
    """A done job's record in syncjobs' results table, kept ``keep_result`` seconds."""

    attempts = models.IntegerField()
    result = models.TextField(null=True)
    finished_at = models.FloatField()
    expires_at = models.FloatField()
    #: What it was dispatched with (a task's arguments); None for a record older than schema version 5.
    payload = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "syncjobs_jobs_results"
        ordering = ("-finished_at", "id")
        verbose_name = "finished job"

    @property
    def finished(self) -> datetime.datetime | None:
        return _moment(self.finished_at)

    @property
    def expires(self) -> datetime.datetime | None:
        return _moment(self.expires_at)


class ScheduleRecord(models.Model):
    """A periodic job's schedule as the workers record it: the last slot dispatched and the next (schema 8)."""

    #: The SHA-256 (hex) of the JSON of [queue, name].
    id = models.CharField(primary_key=True, max_length=64)
    queue = models.CharField(max_length=100)
    name = models.CharField(max_length=200)
    description = models.CharField(max_length=255)
    last_slot = models.FloatField(null=True)
    next_slot = models.FloatField()
    updated_at = models.FloatField()

    class Meta:
        managed = False
        db_table = "syncjobs_jobs_schedules"
        ordering = ("queue", "name")
        verbose_name = "schedule"

    def __str__(self) -> str:
        return f"{self.name} ({self.queue})"

    @property
    def last_run(self) -> datetime.datetime | None:
        return _moment(self.last_slot)

    @property
    def next_run(self) -> datetime.datetime | None:
        return _moment(self.next_slot)


class TaskResultRecord(models.Model):
    """What ``get_result()`` answers from: one row per task enqueued on the syncjobs Tasks backend."""

    id = models.CharField(primary_key=True, max_length=64)
    backend = models.CharField(max_length=100)
    task_path = models.CharField(max_length=300)
    queue_name = models.CharField(max_length=100)
    priority = models.IntegerField(default=0)
    takes_context = models.BooleanField(default=False)
    run_after = models.DateTimeField(null=True)
    status = models.CharField(max_length=10, default="READY")
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    enqueued_at = models.DateTimeField(null=True)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    last_attempted_at = models.DateTimeField(null=True)
    return_value = models.JSONField(null=True)
    errors = models.JSONField(default=list)
    worker_ids = models.JSONField(default=list)

    class Meta:
        db_table = "syncjobs_task_results"
        verbose_name = "task result"

    def __str__(self) -> str:
        return f"{self.task_path} ({self.id}): {self.status}"

    def fields(self) -> dict[str, Any]:
        return {field.name: getattr(self, field.name) for field in self._meta.fields}
