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
from .job import DEFAULT_MAX_ATTEMPTS, Job
from .payload import describe_arguments
from .retry import retry_backoff, wait_seconds

P = ParamSpec("P")
R = TypeVar("R")

#: A task's own backoff: seconds after the 0-based failed run, or a tenacity wait strategy.
RetryWait = Callable[[int], float] | wait_base
#: Enqueues a job with dispatch options; returns its id (a queue's, or an integration's ``dispatch``).
Send = Callable[..., str]


class FunctionJob(Job):
    """One call of a task's function: its arguments, as Python bound them, are the payload."""

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
        args, kwargs = data.get("args", []), data.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not set(data) <= {"args", "kwargs"}:
            raise ValueError(
                f"task {cls.NAME!r}: a payload must be {{'args': [...], 'kwargs': {{...}}}}, got keys {sorted(data)}"
            )
        return cls(args, kwargs)

    def run(self) -> None:
        type(self).FUNCTION(*self.args, **self.kwargs)

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
    ) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.job_class = job_class
        #: The stable name the task's jobs travel under (its job class's ``NAME``).
        self.name = job_class.NAME
        self._signature = inspect.signature(function)
        self._check_call = _call_checker(function, self._signature)
        self._send = send
        self._options = dict(options)
        self._allowed = allowed

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)

    def dispatch(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue a call of the function with these arguments; returns the job's id.

        The arguments must bind to the function's parameters and survive a
        JSON round trip: a ``QueueError`` naming the task and the parameter
        says which did not, and nothing is enqueued.
        """
        try:
            self._check_call(*args, **kwargs)
        except TypeError as exc:
            raise QueueError(f"task {self.name!r}: {exc}") from None
        try:
            return self._send(self.job_class(list(args), kwargs), **self._options)
        except QueueError as exc:
            problem = describe_arguments(_as_sent(self._signature.bind(*args, **kwargs)))
            if problem is None:  # not the arguments: a bad delay, say, or a carried value
                raise
            raise QueueError(f"task {self.name!r}: {problem}") from exc

    def using(self, **options: Any) -> Task[P, R]:
        """This task with dispatch options set: ``delay=``, ``run_at=``, and what the queue's ``dispatch`` takes.

        That is ``connection=`` on a database queue, ``queue=`` in the Django
        and Flask integrations. Returns a new task; this one is unchanged.
        """
        _check_options(self.name, options, self._allowed)
        return Task(self.function, self.job_class, self._send, {**self._options, **options}, self._allowed)

    def __repr__(self) -> str:
        return f"<Task {self.name!r} of {_path(self.function)}>"


class Decorate(Protocol):
    """What ``@queue.task(…)`` with options returns: the decorator proper."""

    def __call__(self, function: Callable[P, R], /) -> Task[P, R]: ...


@dataclasses.dataclass(frozen=True)
class TaskDecorator:
    """``@queue.task`` and ``@queue.task(name=…, max_attempts=…, retry_wait=…)``, for a queue or an integration.

    ``dispatch_options`` names what the decorator may fix for every dispatch
    of the task (``queue=`` in an integration, say).
    """

    register: Callable[[type[Job]], object]
    send: Send
    #: What ``using()`` takes: the keyword arguments of ``send`` after the job.
    dispatch_options: frozenset[str]
    #: Those the decorator may fix for every dispatch of the task.
    task_options: frozenset[str] = frozenset()

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
        **options: Any,
    ) -> Task[..., Any] | Decorate:
        unknown = set(options) - self.task_options
        if unknown:
            allowed = ", ".join(sorted({"name", "max_attempts", "retry_wait", *self.task_options}))
            raise TypeError(f"task() got unexpected argument(s) {', '.join(sorted(unknown))}; it takes {allowed}")
        if retry_wait is not None and not callable(retry_wait):  # a tenacity wait is callable too
            raise TypeError(
                f"retry_wait must be a function of the failed attempt or a tenacity wait, got {retry_wait!r}"
            )

        def decorate(function: Callable[P, R]) -> Task[P, R]:
            job_class = _job_class(function, name, max_attempts, retry_wait)
            self.register(job_class)
            return Task(function, job_class, self.send, options, self.dispatch_options)

        if function is None:
            return decorate
        return decorate(function)


def _job_class(
    function: Callable[..., Any], name: str | None, max_attempts: int, retry_wait: RetryWait | None
) -> type[FunctionJob]:
    if not inspect.isfunction(function):
        raise TypeError(f"task() takes a plain function, got {function!r}")
    if "<" in function.__qualname__ and name is None:
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
        "FUNCTION": staticmethod(function),
        "__module__": function.__module__,
        "__qualname__": function.__qualname__,
        "__doc__": function.__doc__,
    }
    return type(function.__name__, (FunctionJob,), attributes)


def _check_options(name: str, options: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = set(options) - allowed
    if unknown:
        raise TypeError(
            f"task {name!r}: using() got unexpected option(s) {', '.join(sorted(unknown))}; "
            f"it takes {', '.join(sorted(allowed))}"
        )


class _Default:
    """Stands for every default in a call checker's source: only whether a parameter has one matters."""

    def __repr__(self) -> str:
        return "_default"


def _call_checker(function: Callable[..., Any], signature: inspect.Signature) -> Callable[..., None]:
    """A function with ``function``'s parameters that does nothing: calling it checks a call's arguments.

    Python's own check, the one a call of ``function`` makes, at a fraction
    of ``Signature.bind``'s cost; its ``TypeError`` reads as that call's would.
    The source is made from the function's parameter names (the developer's
    code, never a payload), as ``dataclasses`` makes ``__init__``.
    """
    parameters = [
        parameter.replace(
            annotation=inspect.Parameter.empty,
            default=inspect.Parameter.empty if parameter.default is inspect.Parameter.empty else _Default(),
        )
        for parameter in signature.parameters.values()
    ]
    text = str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))
    name = function.__name__ if function.__name__.isidentifier() else "task"
    namespace: dict[str, Any] = {"_default": None}
    exec(f"def {name}{text}: pass", namespace)  # noqa: S102 - parameter names only, see above
    checker: Callable[..., None] = namespace[name]
    return checker


def _as_sent(bound: inspect.BoundArguments) -> dict[str, Any]:
    """The bound arguments, ``*args`` as the list it travels as (a tuple is refused elsewhere)."""
    parameters = bound.signature.parameters
    return {
        name: list(value) if parameters[name].kind is inspect.Parameter.VAR_POSITIONAL else value
        for name, value in bound.arguments.items()
    }


def _path(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__qualname__}"
