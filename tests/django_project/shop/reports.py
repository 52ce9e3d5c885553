"""A Django task in a module nothing imports at startup (no app's ready(), no URL, no view)."""

from __future__ import annotations

from django.tasks import task


@task
def count_words(text: str) -> int:
    return len(text.split())


@task(backend="immediate")
def shout(text: str) -> str:
    """Declared for another backend; sent to syncjobs with ``using(backend="default")``."""
    return text.upper()


@task
def fail_in_lines(text: str) -> None:
    raise RuntimeError(f"first line\n{text}")
