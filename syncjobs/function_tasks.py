"""Function tasks: ``@queue.task`` makes a plain function a job that ``.dispatch(...)`` enqueues.

A task is a :class:`~syncjobs.Job` like any other underneath: a class made
for the function, whose payload is the call's arguments. So it runs through
the same worker loop, and shows the same way in logs, stats, dead letters and
the admin, as class jobs do.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar, overload

from tenacity.wait import wait_base
from typing_extensions import ParamSpec, Self

from .errors import QueueError
from .job import DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, Job, check_priority
from .limits import Limit, check_limit
from .payload import describe_arguments
from .retry import retry_backoff, wait_seconds
from .schedules import Schedule
from .status import JobHandle
from .unique import Unique, check_unique

P = ParamSpec("P")
R = TypeVar("R")

#: A task's own backoff: seconds after the 0-based failed run, or a tenacity wait strategy.
RetryWait = Callable[[int], float] | wait_base
#: Enqueues a job with dispatch options; returns its id (a queue's, or an integration's ``dispatch``).
Send = Callable[..., JobHandle]


_PAYLOAD_KEYS = frozenset({"args", "kwargs"})


class FunctionJob(Job):
    """One call of a task's function: its arguments are the payload (see ``_Call`` for their form)."""

    #: The function a run calls; set on the class made for each task.
    FUNCTION: ClassVar[Callable[..., Any]]
    RETRY_WAIT: ClassVar[RetryWait | None] = None

    def __init__(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.args = args
        self.kwargs = kwargs

    def to_payload(self) -> dict[str, Any]:
        return {"args": self.args, "kwargs": self.kwargs}

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> Self:
        if len(data) == 2:  # what dispatch() writes: both keys, decoded as a list and a dict
            try:
                args, kwargs = data["args"], data["kwargs"]
            except KeyError:
                args = kwargs = None
            if type(args) is list and type(kwargs) is dict:
                return cls(args, kwargs)
        args, kwargs = data.get("args", []), data.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not data.keys() <= _PAYLOAD_KEYS:
            raise ValueError(
                f"task {cls.NAME!r}: a payload must be {{'args': [...], 'kwargs': {{...}}}}, got keys {sorted(data)}"
            )
        return cls(args, kwargs)

    def run(self) -> Any:
        return type(self).FUNCTION(*self.args, **self.kwargs)

    def unique_values(self) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults filled in: what ``Unique(...)`` picks from."""
        bound = _signature(type(self).FUNCTION).bind(*self.args, **self.kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    @classmethod
    def unique_field_names(cls) -> tuple[str, ...] | None:
        return tuple(_signature(cls.FUNCTION).parameters)

    def retry_wait(self, failed_attempt: int) -> float:
        wait = type(self).RETRY_WAIT
        if wait is None:
            return retry_backoff(failed_attempt)
        if isinstance(wait, wait_base):
            return wait_seconds(wait, failed_attempt)
        return wait(failed_attempt)

    def __repr__(self) -> str:
        return f"<task {self.NAME!r} args={self.args!r} kwargs={self.kwargs!r}>"


class Task(Generic[P, R]):
    """A function that can also be dispatched: ``task(…)`` calls it here, ``task.dispatch(…)`` enqueues the call.

    ``dispatch`` takes exactly the function's parameters (mypy checks them);
    options for the dispatch itself come first, through :meth:`using`::

        send_welcome.using(delay=60).dispatch(user_id=42)
    """

    def __init__(
        self,
        function: Callable[P, R],
        job_class: type[FunctionJob],
        send: Send,
        options: Mapping[str, Any],
        allowed: frozenset[str],
        *,
        call: _Call | None = None,
    ) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.job_class = job_class
        #: The stable name the task's jobs travel under (its job class's ``NAME``).
        self.name = job_class.NAME
        self._call = call or _Call(function)
        self._send = send
        self._options = dict(options)
        self._allowed = allowed

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)

    def dispatch(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """Enqueue a call of the function with these arguments; returns the job's handle (its id).

        The arguments must bind to the function's parameters and survive a
        JSON round trip: a ``QueueError`` naming the task and the parameter
        says which did not, and nothing is enqueued.
        """
        call = self._call
        named: dict[str, Any] = kwargs
        positional: list[Any] = []
        # Every parameter by name, the common form, fits without a check.
        if args or kwargs.keys() != call.all_by_name:
            try:
                positional, named = call.arguments(args, kwargs)
            except TypeError as exc:
                raise QueueError(f"task {self.name!r}: {exc}") from None
        try:
            job = self.job_class(positional, named)
            return self._send(job, **self._options) if self._options else self._send(job)
        except QueueError as exc:
            problem = self._call.describe(positional, named)
            if problem is None:  # not the arguments: a bad delay, say, or a carried value
                raise
            raise QueueError(f"task {self.name!r}: {problem}") from exc

    def using(self, **options: Any) -> Task[P, R]:
        """This task with dispatch options set: ``delay=``, ``run_at=``, and what the queue's ``dispatch`` takes.

        That is ``connection=`` on a database queue, ``queue=`` in the Django
        and Flask integrations. Returns a new task; this one is unchanged.
        """
        _refuse_unknown(options, self._allowed, f"task {self.name!r}: using() got unexpected option(s)")
        merged = {**self._options, **options}
        return Task(self.function, self.job_class, self._send, merged, self._allowed, call=self._call)

    def __repr__(self) -> str:
        return f"<Task {self.name!r} of {_path(self.function)}>"


class Decorate(Protocol):
    """What ``@queue.task(…)`` with options returns: the decorator proper."""

    def __call__(self, function: Callable[P, R], /) -> Task[P, R]: ...


@dataclasses.dataclass(frozen=True)
class TaskDecorator:
    """``@queue.task``, or ``@queue.task(name=…, max_attempts=…, …)``, on a queue or an integration.

    Its options: ``name``, ``max_attempts``, ``retry_wait``, ``timeout``,
    ``keep_result``, ``priority``, ``unique`` (a :class:`~syncjobs.Unique`
    whose fields are the function's parameters), ``limit`` (a
    :class:`~syncjobs.Limit`, likewise) and ``schedule``.

    ``dispatch_options`` names what ``using()`` takes; ``task_options``, the
    part of those the decorator may fix for every dispatch of the task
    (``queue=`` in an integration, say).
    """

    register: Callable[[type[Job]], object]
    send: Send
    #: What ``using()`` takes: the keyword arguments of ``send`` after the job.
    dispatch_options: frozenset[str]
    #: Those the decorator may fix for every dispatch of the task.
    task_options: frozenset[str] = frozenset()
    #: ``schedule(name, schedule, job_class, options)`` runs a task periodically (``schedule=``), with the
    #: decorator's fixed dispatch options (an integration's ``queue=``, say); None where nothing can.
    schedule: Callable[[str, Schedule, type[FunctionJob], Mapping[str, Any]], None] | None = None

    @overload
    def __call__(self, function: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def __call__(
        self,
        function: None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_wait: RetryWait | None = None,
        timeout: float | None = None,
        keep_result: float | None = None,
        priority: int = DEFAULT_PRIORITY,
        unique: Unique | None = None,
        limit: Limit | None = None,
        schedule: Schedule | None = None,
        **options: Any,
    ) -> Decorate: ...

    def __call__(
        self,
        function: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_wait: RetryWait | None = None,
        timeout: float | None = None,
        keep_result: float | None = None,
        priority: int = DEFAULT_PRIORITY,
        unique: Unique | None = None,
        limit: Limit | None = None,
        schedule: Schedule | None = None,
        **options: Any,
    ) -> Task[..., Any] | Decorate:
        shown = frozenset(
            {
                "name",
                "max_attempts",
                "retry_wait",
                "timeout",
                "keep_result",
                "priority",
                "unique",
                "limit",
                "schedule",
                *self.task_options,
            }
        )
        _refuse_unknown(options, self.task_options, "task() got unexpected argument(s)", shown)
        if retry_wait is not None and not callable(retry_wait):  # a tenacity wait is callable too
            raise TypeError(
                f"retry_wait must be a function of the failed attempt or a tenacity wait, got {retry_wait!r}"
            )

        def decorate(function: Callable[P, R]) -> Task[P, R]:
            what = f"task {name if name is not None else _path(function)}"
            check_priority(priority, f"{what}: priority")
            declared = check_unique(unique, f"{what}: unique")
            if declared is not None:
                declared.check_fields(tuple(_signature(function).parameters), what)
            limited = check_limit(limit, f"{what}: limit")
            if limited is not None:
                limited.check_fields(tuple(_signature(function).parameters), what)
            if schedule is not None:
                _check_schedulable(function, schedule, what, self.schedule)
            job_class = _job_class(
                function,
                name,
                max_attempts,
                retry_wait,
                timeout=timeout,
                keep_result=keep_result,
                priority=priority,
                unique=unique,
                limit=limit,
            )
            self.register(job_class)
            if schedule is not None and self.schedule is not None:
                self.schedule(job_class.NAME, schedule, job_class, options)
            return Task(function, job_class, self.send, options, self.dispatch_options)

        if function is None:
            return decorate
        return decorate(function)


def _job_class(
    function: Callable[..., Any],
    name: str | None,
    max_attempts: int,
    retry_wait: RetryWait | None,
    *,
    timeout: float | None,
    keep_result: float | None,
    priority: int,
    unique: Unique | None,
    limit: Limit | None,
) -> type[FunctionJob]:
    if not inspect.isfunction(function):
        raise TypeError(f"task() takes a plain function, got {function!r}")
    if function.__qualname__ != function.__name__ and name is None:
        # A worker process finds a task by importing its module: a lambda or
        # a function defined inside another is only there while that runs.
        raise TypeError(
            f"task {_path(function)} is not a module-level function: a worker could not import it; "
            "define it at module level (or give it a name= and register it in every process)"
        )
    attributes = {
        "NAME": name if name is not None else _path(function),
        "MAX_ATTEMPTS": max_attempts,
        "RETRY_WAIT": retry_wait,
        "TIMEOUT": timeout,
        "KEEP_RESULT": keep_result,
        "PRIORITY": priority,
        "UNIQUE": unique,
        "LIMIT": limit,
        "FUNCTION": staticmethod(function),
        "__module__": function.__module__,
        "__qualname__": function.__qualname__,
        "__doc__": function.__doc__,
    }
    return type(function.__name__, (FunctionJob,), attributes)


def _check_schedulable(
    function: Callable[..., Any], schedule: object, what: str, add: Callable[..., None] | None
) -> None:
    """``TypeError`` unless ``schedule`` is a Schedule that can run here, and the function takes no arguments."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"{what}: schedule must be a syncjobs.Schedule(...), got {schedule!r}")
    if add is None:
        raise TypeError(f"{what}: schedule= needs a queue: use queue.task(schedule=...) or queue.schedule(...)")
    try:
        _signature(function).bind()
    except TypeError:
        raise TypeError(
            f"{what}: a scheduled task is called with no arguments, and {function.__name__}() needs some; "
            "use queue.schedule(name, lambda slot: ...) to dispatch it with arguments"
        ) from None


def _refuse_unknown(
    options: Mapping[str, Any], accepted: frozenset[str], refusal: str, shown: frozenset[str] | None = None
) -> None:
    """``TypeError`` starting with ``refusal`` for keys of ``options`` not ``accepted``; it lists ``shown``."""
    unknown = set(options) - accepted
    if unknown:
        listed = ", ".join(sorted(accepted if shown is None else shown))
        raise TypeError(f"{refusal} {', '.join(sorted(unknown))}; it takes {listed}")


class _Default:
    """Stands for every default in a call checker's source: only whether a parameter has one matters."""

    def __repr__(self) -> str:
        return "_default"


class _Call:
    """How a call of one function travels: checked as Python checks it, its arguments by name where they can be.

    By name, so that a call queued before a deploy that reorders the
    function's parameters still means what it meant; by position only what
    has no name (positional-only parameters, and all of a call that fills
    ``*args``).
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        # The signature of what a run calls: a wrapper's own, not what it wraps.
        parameters = list(inspect.signature(function, follow_wrapped=False).parameters.values())
        kinds = [parameter.kind for parameter in parameters]
        self._positional_only = kinds.count(inspect.Parameter.POSITIONAL_ONLY)
        self._by_name = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        self._check = _checker(function, parameters)
        # Every parameter, where each can be given by name and none gathers the rest: a call giving exactly
        # these by name, and nothing by position, fits without a check (the common form of a dispatch).
        by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self.all_by_name = frozenset(p.name for p in parameters) if all(k in by_name for k in kinds) else None

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The call's ``args`` and ``kwargs`` as they travel; ``TypeError`` (as the call's own) if they do not fit.

        Not asked of a call that gives exactly ``all_by_name`` by name, and nothing by position: that one fits.
        """
        self._check(*args, **kwargs)
        first = self._positional_only
        if len(args) <= first or len(args) > first + len(self._by_name):
            return list(args), kwargs  # nothing to name, or it fills *args: positions matter
        # No clash with kwargs: the check refused a parameter given twice.
        return list(args[:first]), {**dict(zip(self._by_name, args[first:], strict=False)), **kwargs}

    def describe(self, args: list[Any], kwargs: dict[str, Any]) -> str | None:
        """What JSON cannot carry among these arguments, by parameter name or position."""
        return describe_arguments({**{f"args[{index}]": value for index, value in enumerate(args)}, **kwargs})


def _checker(function: Callable[..., Any], parameters: list[inspect.Parameter]) -> Callable[..., None]:
    """A function with these parameters that does nothing: calling it checks a call's arguments.

    Python's own check, the one a call of ``function`` makes, at a fraction
    of ``Signature.bind``'s cost, and its ``TypeError`` reads as that call's
    would. The source is made from the parameter names (validated by
    ``inspect.Parameter``: the developer's code, never a payload), with no
    annotation and every default a placeholder, as ``dataclasses`` makes
    ``__init__``.
    """
    plain = [
        parameter.replace(
            annotation=inspect.Parameter.empty,
            default=inspect.Parameter.empty if parameter.default is inspect.Parameter.empty else _Default(),
        )
        for parameter in parameters
    ]
    namespace: dict[str, Any] = {"_default": None}
    exec(f"def checker{inspect.Signature(plain)}: pass", namespace)  # noqa: S102 - parameter names only, see above
    checker: Callable[..., None] = namespace["checker"]
    # Under the function's own name, so that an error reads "send_welcome() missing …".
    checker.__name__ = checker.__qualname__ = function.__name__
    return checker


@functools.cache
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(function, follow_wrapped=False)


def _path(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__qualname__}"
