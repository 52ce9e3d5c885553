"""Which job class runs which NAME, per queue."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from .errors import QueueError
from .job import Job, check_max_attempts, check_name, check_timeout
from .limits import check_limit
from .unique import check_unique

J = TypeVar("J", bound=type[Job])

#: Given a NAME no registered class has, the class that runs it (or None): see ``StoreQueue.find_job_classes_with``.
JobFinder = Callable[[str], "type[Job] | None"]

logger = logging.getLogger("syncjobs.worker")

#: Seconds a NAME no finder found is not looked for again: each look may import modules.
UNFOUND_FOR = 60.0


class Registry:
    def __init__(self) -> None:
        self._by_name: dict[str, type[Job]] = {}
        self._finders: list[JobFinder] = []
        #: NAMEs no finder found, with when they may be looked for again (monotonic).
        self._unfound: dict[str, float] = {}
        self._lock = threading.Lock()
        #: Whether any class registered declares a ``LIMIT``: until one does, claims look no further.
        self.any_limited = False

    def register(self, job_cls: J) -> J:
        if not (isinstance(job_cls, type) and issubclass(job_cls, Job)):
            raise TypeError(f"register() takes a subclass of syncjobs.Job, got {job_cls!r}")
        name = check_name(job_cls)
        check_max_attempts(job_cls)
        check_timeout(job_cls.TIMEOUT, f"job class {job_cls.__qualname__}: TIMEOUT")
        unique = check_unique(job_cls.UNIQUE, f"job class {job_cls.__qualname__}: UNIQUE")
        if unique is not None:  # a field the class does not have, where its fields are known
            unique.check_fields(job_cls.unique_field_names(), f"job class {job_cls.__qualname__}")
        limit = check_limit(job_cls.LIMIT, f"job class {job_cls.__qualname__}: LIMIT")
        if limit is not None:
            limit.check_fields(job_cls.unique_field_names(), f"job class {job_cls.__qualname__}")
            self.any_limited = True
        with self._lock:
            taken = self._by_name.setdefault(name, job_cls)
        if taken is not job_cls:
            raise QueueError(f"job NAME {name!r} of {_qualified(job_cls)} is already taken by {_qualified(taken)}")
        return job_cls

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._by_name)

    def find_with(self, finder: JobFinder) -> None:
        with self._lock:
            self._finders.append(finder)

    def get(self, name: str) -> type[Job] | None:
        """The class registered as ``name``; failing that, the one a finder finds (registered from then on)."""
        found = self._by_name.get(name)
        if found is None and self._finders:
            return self._find(name)
        return found

    def _find(self, name: str) -> type[Job] | None:
        if time.monotonic() < self._unfound.get(name, 0.0):
            return None
        for finder in list(self._finders):
            try:
                found = finder(name)
                if found is None:
                    continue
                if getattr(found, "NAME", None) != name:
                    raise QueueError(f"it returned {found!r}, whose NAME is not {name!r}")
                self.register(found)
            except Exception:  # a finder's failure leaves the job unrunnable here, and the worker serving
                logger.warning("finding the job class for NAME %r failed", name, exc_info=True)
                continue
            return found
        found = self._by_name.get(name)  # a finder may have registered it itself
        if found is None:
            self._unfound[name] = time.monotonic() + UNFOUND_FOR
        return found

    def check_dispatchable(self, job: object) -> type[Job]:
        """The job's class, if this queue can run it; else ``QueueError`` saying why."""
        cls = type(job)
        if not isinstance(job, Job):
            raise QueueError(f"dispatch() takes a syncjobs.Job instance, got {cls.__qualname__}")
        name = getattr(cls, "NAME", None)
        if not isinstance(name, str) or self._by_name.get(name) is not cls:
            raise QueueError(
                f"job {name!r} ({_qualified(cls)}) is not registered with this queue: "
                f"call queue.register({cls.__name__}) first"
            )
        return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
