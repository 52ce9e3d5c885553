"""The shop's background jobs, and its Django Tasks."""

from __future__ import annotations

import dataclasses

from django.tasks import task

import syncjobs
from syncjobs.contrib.django import register

from .models import Order


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


@task
def add(a: int, b: int) -> int:
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
