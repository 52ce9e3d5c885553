"""The jobs table in the Django admin: browse, filter, search by id; retry or purge dead letters.

Read-only: a job's payload is shown, never edited. Needs ``"DATABASE"`` in
settings.SYNCJOBS (the table must be one of Django's databases).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ...database import DatabaseJobQueue
from . import conf, get_queue
from .models import QueuedJob


@admin.register(QueuedJob)
class QueuedJobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "name", "queue", "state", "runs", "due", "short_error")
    list_filter = ("queue", "state", "name")
    search_fields = ("=id",)
    ordering = ("run_at", "id")
    actions = ("retry_dead_letters", "purge_dead_letters")
    fields = (
        "id",
        "name",
        "queue",
        "state",
        "runs",
        "due",
        "created",
        "finished",
        "error",
        "pretty_payload",
        "context",
        "lease_owner",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[QueuedJob]:
        jobs: QuerySet[QueuedJob] = super().get_queryset(request).using(conf.read().database or "default")
        return jobs

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The list's actions need "change"; a job's own page is view-only, so
        # that no save ever writes a stale copy over a row a worker owns.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # rows belong to workers; dead letters go through the purge action

    @admin.display(description="runs")
    def runs(self, job: QueuedJob) -> str:
        return f"{job.attempt} of {job.max_attempts}"

    @admin.display(description="error")
    def short_error(self, job: QueuedJob) -> str:
        error = job.error or ""
        return error if len(error) <= 80 else error[:77] + "..."

    @admin.display(description="payload")
    def pretty_payload(self, job: QueuedJob) -> str:
        try:
            text = json.dumps(json.loads(job.payload), indent=2, sort_keys=True)
        except ValueError:
            text = job.payload
        return format_html("<pre>{}</pre>", text)

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
