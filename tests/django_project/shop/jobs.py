"""The shop's background jobs, and its Django Tasks."""

from __future__ import annotations

import dataclasses

from django.tasks import task

import syncjobs
import syncjobs.contrib.django
from syncjobs.contrib.django import on_dead_letter, register
from tests import cli_jobs

from .models import Order

# What the worker command tests (tests/test_worker_commands.py) run.
register(cli_jobs.Sleepy)
register(cli_jobs.Stubborn)

#: What the project's dead-letter callback saw: (job name, error).
DEAD_LETTERS: list[tuple[str, str]] = []


@on_dead_letter
def remember_dead_letter(dead: syncjobs.DeadLetter) -> None:
    DEAD_LETTERS.append((dead.name, dead.error))


@register
@dataclasses.dataclass
class ConfirmOrder(syncjobs.Job):
    NAME = "shop.confirm_order"
    number: str
    database: str

    def run(self) -> None:
        # The ORM, from a worker thread: syncjobs closes stale connections around it.
        updated = Order.objects.using(self.database).filter(number=self.number).update(confirmed=True)
        if not updated:
            raise syncjobs.Fatal(f"no order {self.number}")


@syncjobs.contrib.django.task(name="shop.confirm")
def confirm(number: str, *, database: str = "default") -> None:
    """A syncjobs function task (not a Django Task): ConfirmOrder as a function."""
    if not Order.objects.using(database).filter(number=number).update(confirmed=True):
        raise syncjobs.Fatal(f"no order {number}")


@syncjobs.contrib.django.task(name="shop.measure")
def measure(label: str) -> dict[str, str]:
    """Reports its progress and returns a value, for the admin's finished jobs."""
    job = syncjobs.current_job()
    assert job is not None
    job.progress(2, 4, "halfway")
    return {"label": label}


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=10)
def urgent_add(a: int, b: int) -> int:
    """A Django task with a priority: claimed before the due tasks of lower ones."""
    return a + b


@task
def explode(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def which_attempt(context: object) -> int:
    return context.attempt  # type: ignore[attr-defined]


@task
async def double_later(x: int) -> int:
    return x * 2


@task(queue_name="reports")
def monthly_report() -> dict[str, object]:
    return {"orders": Order.objects.count(), "ok": True}


@task
def confirm_existing(number: str) -> str:
    """Fails while the order does not exist."""
    if not Order.objects.filter(number=number).update(confirmed=True):
        raise LookupError(f"no order {number}")
    return number
