"""A Django task in a module nothing imports at startup (no app's ready(), no URL, no view)."""

from __future__ import annotations

from django.tasks import task


@task
def count_words(text: str) -> int:
    return len(text.split())
