"""Which queue a command works on: ``--url`` (or ``SYNCJOBS_URL``), or an app's queue object.

An app names its queue as ``package.module:attr`` (a queue, or a callable
returning one); its module registers the job classes. With ``--url``, the job
classes are those of the modules named with ``--import``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import tenacity

from ..database import DatabaseJobQueue
from ..database.dialects import Connector
from ..errors import QueueError
from ..job import Job
from ..memory import InMemoryJobQueue
from ..payload import a_kind
from ..queue import DEFAULT_SHUTDOWN_GRACE
from ..status import DEFAULT_KEEP_RESULT
from ..urls import mask_url, redact

URL_VARIABLE = "SYNCJOBS_URL"
DEFAULT_TABLE = "syncjobs_jobs"

logger = logging.getLogger("syncjobs.worker")


class CommandError(Exception):
    """A mistake the user can fix: printed as one line, the command exits non-zero."""


@dataclasses.dataclass(frozen=True)
class TableTarget:
    """The table a command works on, where a framework's settings name it (no --url to type)."""

    url: str = dataclasses.field(repr=False)
    table: str = DEFAULT_TABLE
    #: The driver's keyword arguments over what ``url`` says (a framework's database settings).
    connect_args: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    #: What creates the table, for the error that says it is missing.
    created_by: str = "`syncjobs migrate`"


def import_module(name: str) -> ModuleType:
    # Like gunicorn and flask, find the app's modules from where the command runs.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if getattr(exc, "name", None) == name:
            raise CommandError(f"cannot import {name!r}: no such module (run from the app's directory?)") from exc
        raise CommandError(f"importing {name!r} failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise CommandError(f"importing {name!r} failed: {type(exc).__name__}: {exc}") from exc


def load_app(path: str) -> DatabaseJobQueue:
    """The queue named by ``package.module:attr`` (``attr`` defaults to ``queue``)."""
    module_name, _, attr = path.partition(":")
    if not module_name:
        raise CommandError(f"APP {path!r} must look like 'package.module:queue'")
    target: Any = import_module(module_name)
    for part in (attr or "queue").split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CommandError(f"APP {path!r}: module {module_name!r} has no attribute {attr or 'queue'!r}") from None
    if callable(target) and not isinstance(target, (DatabaseJobQueue, InMemoryJobQueue)):
        try:
            target = target()
        except Exception as exc:
            raise CommandError(f"APP {path!r}: calling it failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(target, InMemoryJobQueue):
        raise CommandError(
            f"APP {path!r} is an in-memory queue: its jobs live inside the process that dispatches them, "
            "where queue.start() runs them; a worker process needs a database queue"
        )
    if not isinstance(target, DatabaseJobQueue):
        raise CommandError(f"APP {path!r} is {a_kind(target)}, not a syncjobs queue")
    return target


def job_classes(modules: Iterable[ModuleType]) -> list[type[Job]]:
    """The job classes a module offers: those it holds, and those defined in it or its submodules.

    Only classes that set a ``NAME`` of their own count; a base class without
    one is a template, not a job.
    """
    found: dict[type[Job], None] = {}
    for module in modules:
        prefix = module.__name__ + "."
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Job) and "NAME" in value.__dict__:
                found[value] = None
        for cls in _all_subclasses(Job):
            if "NAME" in cls.__dict__ and (cls.__module__ == module.__name__ or cls.__module__.startswith(prefix)):
                found[cls] = None
    return list(found)


def _all_subclasses(cls: type[Job]) -> Iterator[type[Job]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def database_url(url: str | None) -> str:
    url = url or os.environ.get(URL_VARIABLE)
    if not url:
        raise CommandError(f"no queue given: pass --url URL (or set {URL_VARIABLE}), or an APP 'package.module:queue'")
    if urlsplit(url).scheme == "memory":
        raise CommandError(
            "memory:// holds jobs inside one process: a command cannot reach them; "
            "use sqlite:///path, postgresql://… or mysql://…"
        )
    return url


def check_reachable(url: str, connect_args: Mapping[str, Any] | None = None, *, wait: float = 0.0) -> None:
    """One connection: a worker or a command that cannot reach its database says so in one line.

    With ``wait``, it tries again for up to that many seconds first (a
    container started together with its database), saying so once.
    """
    try:
        connector = Connector(url, connect_args)
    except QueueError as exc:
        raise CommandError(str(exc)) from exc
    where = f"the {connector.dialect.name} database at {mask_url(url)}"

    def say_waiting(state: tenacity.RetryCallState) -> None:
        if state.attempt_number == 1 and state.outcome is not None:
            error = redact(one_line(state.outcome.exception() or Exception()), url)
            logger.info("cannot reach %s yet (%s): trying again for up to %gs", where, error, wait)

    attempts = tenacity.Retrying(
        # A connection refused or lost, as from a database not up yet; not a bad URL. (Drivers
        # raise a wrong password as the same OperationalError: it is tried again too.)
        retry=tenacity.retry_if_exception(connector.is_connection_error),
        stop=tenacity.stop_after_delay(wait),
        wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
        before_sleep=say_waiting,
        reraise=True,
    )
    try:
        attempts(lambda: connector.connect().close())
    except KeyboardInterrupt:
        raise CommandError(f"interrupted while waiting for {where}") from None
    except Exception as exc:
        waited = f" (tried for {wait:g}s)" if wait else ""
        raise CommandError(f"cannot reach {where}{waited}: {redact(one_line(exc), url)}") from exc


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def queue_for(
    *,
    app: str | None,
    url: str | None,
    imports: Iterable[str] = (),
    table: str | None = None,
    workers: int | None = None,
    queue: str | None = None,
    grace: float | None = None,
    timeout: float | None = None,
    keep_result: float | None = None,
) -> DatabaseJobQueue:
    """The queue a command works on, with the job classes of ``imports`` registered."""
    if app and url:
        raise CommandError("give an APP or --url, not both (the APP's queue knows its URL)")
    try:
        if app:
            base = load_app(app)
            if table and table != base.table:
                raise CommandError(f"APP {app!r} uses table {base.table!r}; --table {table!r} does not match it")
            found = base.for_queue(
                queue, workers=workers, shutdown_grace=grace, timeout=timeout, keep_result=keep_result
            )
        else:
            found = DatabaseJobQueue(
                database_url(url),
                workers=4 if workers is None else workers,
                queue=queue or "default",
                shutdown_grace=DEFAULT_SHUTDOWN_GRACE if grace is None else grace,
                timeout=timeout,
                keep_result=DEFAULT_KEEP_RESULT if keep_result is None else keep_result,
                table=table or DEFAULT_TABLE,
            )
    except (ValueError, QueueError) as exc:
        raise CommandError(str(exc)) from exc
    for cls in job_classes(import_module(name) for name in imports):
        try:
            found.register(cls)  # again for the APP's own classes: a no-op
        except Exception as exc:
            raise CommandError(f"cannot register {cls.__module__}.{cls.__qualname__}: {exc}") from exc
    return found
