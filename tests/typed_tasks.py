"""Typed calls of function tasks: mypy checks this file (``tox -e mypy``), strictly.

Every call below type-checks except the ones marked ``type: ignore[…]``;
under ``warn_unused_ignores`` (part of ``strict``) mypy fails if one of those
ever type-checks, so the file proves both that good calls pass and that bad
ones are caught. The tests also run it, so it cannot rot.
"""

from __future__ import annotations

import datetime

import syncjobs

queue = syncjobs.InMemoryJobQueue(workers=1)  # started by the test that runs good_calls()


@queue.task
def send_welcome(user_id: int, *, locale: str = "en") -> str:
    return f"welcome {user_id} ({locale})"


@queue.task(name="typed.resize", max_attempts=3)
def resize(path: str, width: int, height: int | None = None) -> None:
    pass


def good_calls() -> list[str]:
    called: str = send_welcome(42)  # a task still just calls its function
    ids = [
        send_welcome.dispatch(42),
        send_welcome.dispatch(user_id=42, locale="fr"),
        resize.dispatch("a.png", 100),
        resize.using(delay=datetime.timedelta(milliseconds=50)).dispatch("a.png", width=100, height=50),
        resize.using(run_at=datetime.datetime.now(datetime.timezone.utc)).dispatch("a.png", 1),
    ]
    return [called, *ids]


def bad_calls() -> None:
    """Never run: each call is a type error mypy must report."""
    send_welcome.dispatch("42")  # type: ignore[arg-type]
    send_welcome.dispatch(42, "fr")  # type: ignore[call-arg]
    resize.dispatch("a.png")  # type: ignore[call-arg]
    resize.dispatch("a.png", 100, colour="red")  # type: ignore[call-arg]
    text: int = send_welcome(1)  # type: ignore[assignment]
    del text
