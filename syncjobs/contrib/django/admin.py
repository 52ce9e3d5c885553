"""The jobs tables in the Django admin: browse, filter, search by id; cancel jobs; retry or purge dead letters.

Read-only: a job's payload is shown, never edited. Jobs waiting, running,
dead or cancelled are in the jobs table; done jobs' records (with their
results, for ``keep_result`` seconds) in its results table. Needs
``"DATABASE"`` in settings.SYNCJOBS (the tables must be in one of Django's databases).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ...database import DatabaseJobQueue
from . import conf, get_queue
from .models import FinishedJob, QueuedJob, ScheduleRecord


class _TableAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Rows of syncjobs' tables, in the database settings.SYNCJOBS names: never added or deleted here."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows: QuerySet[Any] = super().get_queryset(request).using(conf.read().database or "default")
        return rows

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # rows belong to workers; dead letters go through the purge action


class _JobRecordAdmin(_TableAdmin):
    """Jobs and their records: filtered by queue, state and name, found by id."""

    list_filter = ("queue", "state", "name")
    search_fields = ("=id",)

    @admin.display(description="progress")
    def progress_shown(self, job: QueuedJob | FinishedJob) -> str:
        progress = job.reported_progress
        return "" if progress is None else str(progress)

    @admin.display(description="payload")
    def pretty_payload(self, job: QueuedJob | FinishedJob) -> str:
        return _pretty_json(job.payload)


@admin.register(QueuedJob)
class QueuedJobAdmin(_JobRecordAdmin):
    list_display = ("id", "name", "queue", "state", "priority", "runs", "due", "progress_shown", "short_error")
    ordering = ("run_at", "id")
    actions = ("cancel_jobs", "retry_dead_letters", "purge_dead_letters")
    fields = (
        "id",
        "name",
        "queue",
        "state",
        "priority",
        "runs",
        "due",
        "created",
        "started",
        "finished",
        "progress_shown",
        "cancel_asked",
        "error",
        "pretty_payload",
        "context",
        "lease_owner",
    )
    readonly_fields = fields

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The list's actions need "change"; a job's own page is view-only, so
        # that no save ever writes a stale copy over a row a worker owns.
        return obj is None and super().has_change_permission(request)

    @admin.display(description="runs")
    def runs(self, job: QueuedJob) -> str:
        return f"{job.attempt} of {job.max_attempts}"

    @admin.display(description="cancel asked", boolean=True)
    def cancel_asked(self, job: QueuedJob) -> bool:
        return bool(job.cancel_requested)

    @admin.display(description="error")
    def short_error(self, job: QueuedJob) -> str:
        error = (job.error or "").partition("\n")[0]  # a failed Django task's traceback follows
        return error if len(error) <= 80 else error[:77] + "..."

    @admin.action(description="Cancel the selected jobs", permissions=["change"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[QueuedJob]) -> None:
        """As ``queue.cancel(id)``: a waiting job ends cancelled now, a running one when its worker hears of it."""
        queue = get_queue()
        ids = list(queryset.filter(state__in=("queued", "claimed", "running")).values_list("id", flat=True))
        cancelled = sum(1 for job_id in ids if queue.cancel(job_id))
        self.message_user(
            request,
            f"{cancelled} job(s) cancelled (a running job ends cancelled once its worker sees the request).",
            messages.SUCCESS,
        )

    @admin.action(description="Retry the selected dead letters (fresh attempts)", permissions=["change"])
    def retry_dead_letters(self, request: HttpRequest, queryset: QuerySet[QueuedJob]) -> None:
        ids = list(queryset.filter(state="dead").values_list("id", flat=True))
        queue = get_queue()
        if not isinstance(queue, DatabaseJobQueue):
            self.message_user(request, "the memory backend keeps no dead letters", messages.ERROR)
            return
        retried = queue.admin.retry(ids)
        self.message_user(request, f"{len(retried)} dead letter(s) queued again.", messages.SUCCESS)

    @admin.action(description="Purge the selected dead letters", permissions=["change"])
    def purge_dead_letters(self, request: HttpRequest, queryset: QuerySet[QueuedJob]) -> None:
        deleted, _ = queryset.filter(state="dead").delete()
        self.message_user(request, f"{deleted} dead letter(s) purged.", messages.SUCCESS)


@admin.register(FinishedJob)
class FinishedJobAdmin(_JobRecordAdmin):
    """Done and kept: each job's runs, times, last progress and result, until its record expires."""

    list_display = ("id", "name", "queue", "state", "attempts", "finished", "progress_shown")
    fields = (
        "id",
        "name",
        "queue",
        "state",
        "attempts",
        "max_attempts",
        "created",
        "started",
        "finished",
        "expires",
        "progress_shown",
        "pretty_payload",
        "pretty_result",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # An expired record is gone for status() already; the workers prune it soon.
        kept: QuerySet[Any] = super().get_queryset(request).filter(expires_at__gte=time.time())
        return kept

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # records only: the workers prune them once expired

    @admin.display(description="result")
    def pretty_result(self, job: FinishedJob) -> str:
        return _pretty_json(job.result)


@admin.register(ScheduleRecord)
class ScheduleRecordAdmin(_TableAdmin):
    """Each periodic job's schedule, as the workers that dispatch its slots record it: read only.

    A schedule removed from the code stays listed, with its last run.
    """

    list_display = ("name", "queue", "description", "last_run", "next_run")
    list_filter = ("queue",)
    list_display_links = None
    search_fields = ("name",)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _pretty_json(text: str | None) -> str:
    """JSON text indented in a ``<pre>``, escaped (a payload may hold markup)."""
    if text is None:
        return ""
    with contextlib.suppress(ValueError):  # not JSON after all: shown as it is
        text = json.dumps(json.loads(text), indent=2, sort_keys=True)
    return format_html("<pre>{}</pre>", text)
