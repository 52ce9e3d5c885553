"""Hooks entered around each dispatch: where what a job carries is added to, or a dispatch refused.

A hook is ``hook(job)`` returning a context manager (``contextlib.contextmanager``
makes one). Each is entered while the job is checked and the caller's context
copied, so a context variable it sets travels with the job (in memory; on a
database, when the queue ``carry``-s that variable). Raising ``QueueError``
refuses the dispatch; any other error of a hook is logged and the job goes
out without it: a hook's bug never loses a job.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TypeVar

from .errors import QueueError
from .job import Job

logger = logging.getLogger("syncjobs")

DispatchHook = Callable[[Job], AbstractContextManager[object]]
#: ``observer(name)``: after a job of ``name`` is enqueued (see ``StoreQueue.observe_dispatches``).
DispatchObserver = Callable[[str], object]
T = TypeVar("T")


class DispatchHooks:
    """The hooks of a queue (shared by its twins), entered in the order added, left in reverse."""

    def __init__(self) -> None:
        self._hooks: list[DispatchHook] = []
        #: Whether any hook was added: read at every dispatch (a plain attribute costs less than ``__bool__``).
        self.active = False

    def add(self, hook: DispatchHook) -> None:
        if not callable(hook):
            raise TypeError(f"around_dispatch() takes a callable returning a context manager, got {hook!r}")
        if not already_given(self._hooks, hook):  # once: twins share their hooks, and each may be given it
            self._hooks.append(hook)
            self.active = True

    def around(self, job: Job, make: Callable[[], T]) -> T:
        """``make()`` inside every hook for ``job``: what it returns, or what it (or a hook's veto) raises."""
        entered: list[tuple[DispatchHook, AbstractContextManager[object]]] = []
        try:
            for hook in list(self._hooks):
                try:
                    manager = hook(job)
                    manager.__enter__()
                except QueueError:
                    raise
                except Exception:
                    logger.exception("dispatch hook %r failed on entry; %s goes out without it", hook, _named(job))
                    continue
                entered.append((hook, manager))
            made = make()
        except BaseException:
            _leave(entered, job, *sys.exc_info())
            raise
        _leave(entered, job, None, None, None)
        return made


def already_given(given: Iterable[object], candidate: object) -> bool:
    """Whether ``candidate`` is among ``given``: the same object, or the same method of the same object.

    A bound method is a new object at each attribute read (``items.append``),
    and two are equal when their object is the same one. Not ``==`` for the
    rest: two distinct callables that compare equal (dataclass instances,
    say) are two hooks.
    """
    bound = getattr(candidate, "__self__", None) is not None
    return any(each is candidate or (bound and each == candidate) for each in given)


def _leave(entered: list[tuple[DispatchHook, AbstractContextManager[object]]], job: Job, *exc_info: object) -> None:
    for hook, manager in reversed(entered):
        try:
            manager.__exit__(*exc_info)  # type: ignore[arg-type]  # what sys.exc_info() gave
        except Exception:
            logger.exception("dispatch hook %r failed on exit; %s was not affected", hook, _named(job))


def _named(job: Job) -> str:
    return f"job {getattr(type(job), 'NAME', type(job).__qualname__)!r}"
