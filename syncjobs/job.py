"""The ``Job`` base class: a job is its payload plus a ``run()`` method."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Final

from typing_extensions import Self

from .limits import Limit, check_limit
from .retry import retry_backoff
from .unique import Unique, check_unique

DEFAULT_MAX_ATTEMPTS = 5
#: Priorities run from -100 to 100, higher first (Django's Tasks range and meaning); 0 is the default.
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = -100, 100, 0
#: The longest NAME: the size of the jobs table's ``name`` column.
MAX_NAME_LENGTH = 200


class Job:
    """Base class of every job.

    Subclass it (a dataclass is the usual shape), give it a stable ``NAME`` and
    a ``run()``.  The instance's fields are its payload: they travel as a JSON
    object and the job is rebuilt from them for every run, so a run never sees
    what an earlier run changed on its instance.
    """

    #: Stable identifier that routes payloads to this class. Required.
    NAME: ClassVar[str]
    #: Total runs allowed: one run plus ``MAX_ATTEMPTS - 1`` retries.
    MAX_ATTEMPTS: ClassVar[int] = DEFAULT_MAX_ATTEMPTS
    #: Seconds a run may take before it is cancelled and counts as failed; None: the queue's default.
    TIMEOUT: ClassVar[float | None] = None
    #: Seconds the finished job's record (state and result) is kept for ``status()``; None: the queue's default.
    KEEP_RESULT: ClassVar[float | None] = None
    #: An int from -100 to 100: of the jobs due, those of higher priority run first.
    PRIORITY: ClassVar[int] = DEFAULT_PRIORITY
    #: ``Unique(...)``: while a job with the same key holds it, a dispatch of another is a duplicate.
    UNIQUE: ClassVar[Unique | None] = None
    #: ``Limit(...)``: how many runs may go on at once, and how often one may begin.
    LIMIT: ClassVar[Limit | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A NAME left out may belong to an abstract intermediate class, so its
        # absence is refused at register(); a NAME or MAX_ATTEMPTS written
        # but wrong is refused here, where the mistake is.
        if "NAME" in cls.__dict__:
            check_name(cls)
        if "MAX_ATTEMPTS" in cls.__dict__:
            check_max_attempts(cls)
        if "TIMEOUT" in cls.__dict__:
            check_timeout(cls.TIMEOUT, f"job class {cls.__qualname__}: TIMEOUT")
        if "PRIORITY" in cls.__dict__:
            check_priority(cls.PRIORITY, f"job class {cls.__qualname__}: PRIORITY")
        if "UNIQUE" in cls.__dict__:
            check_unique(cls.UNIQUE, f"job class {cls.__qualname__}: UNIQUE")
        if "LIMIT" in cls.__dict__:
            check_limit(cls.LIMIT, f"job class {cls.__qualname__}: LIMIT")
        if "KEEP_RESULT" in cls.__dict__ and cls.KEEP_RESULT is not None:
            cls.KEEP_RESULT = check_keep_result(cls.KEEP_RESULT, f"job class {cls.__qualname__}: KEEP_RESULT")

    def run(self) -> object:
        """Do the work. Return normally for success (what it returns, JSON, is the job's result); raise to fail."""
        raise NotImplementedError(f"{type(self).__qualname__} must define run()")

    def to_payload(self) -> dict[str, Any]:
        """The job's fields as a JSON-ready dict: a dataclass's ``__init__`` fields, else ``vars()``.

        Fields with ``init=False`` are left out: ``__init__`` (or
        ``__post_init__``) derives them again on the way back.
        """
        names = _field_names.get(type(self), _UNKNOWN)  # as in from_payload()
        if names is _UNKNOWN:
            names = _init_field_names(type(self))
        if names is None:
            return dict(vars(self))
        return {name: getattr(self, name) for name in names}

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> Self:
        """Rebuild a job from :meth:`to_payload`'s dict.

        Dataclasses go through their ``__init__``; plain classes get their
        attributes restored as they were, without calling ``__init__``.
        """
        names = _field_names.get(cls, _UNKNOWN)  # the dict itself: a call costs a tenth of a no-op run
        if names is _UNKNOWN:
            names = _init_field_names(cls)
        if names is not None:
            return cls(**data)
        job = cls.__new__(cls)
        vars(job).update(data)
        return job

    def unique_values(self) -> dict[str, Any]:
        """What a ``Unique`` or ``Limit`` key is made of: the payload (a task's arguments, by parameter name)."""
        return self.to_payload()

    @classmethod
    def unique_field_names(cls) -> tuple[str, ...] | None:
        """The names ``Unique(...)`` may pick from, where they are known before any dispatch (else None)."""
        return _init_field_names(cls)

    def retry_wait(self, failed_attempt: int) -> float:
        """Seconds to wait before retrying after the 0-based run ``failed_attempt``.

        Override it to change this job's backoff; :func:`syncjobs.wait_seconds`
        turns any tenacity wait strategy into one.
        """
        return retry_backoff(failed_attempt)


# Per class, computed once: dataclasses.fields() costs more than the copy it guides.
_field_names: dict[type, tuple[str, ...] | None] = {}
_UNKNOWN: Final = ("not yet looked at",)


def _init_field_names(cls: type) -> tuple[str, ...] | None:
    """The names of a dataclass's ``__init__`` fields, or ``None`` for a plain class."""
    try:
        return _field_names[cls]
    except KeyError:
        pass
    names = tuple(f.name for f in dataclasses.fields(cls) if f.init) if _is_dataclass(cls) else None
    _field_names[cls] = names
    return names


def _is_dataclass(cls: type) -> bool:
    # A plain bool: is_dataclass()'s TypeGuard would narrow Job away for mypy.
    return dataclasses.is_dataclass(cls)


def check_name(cls: type) -> str:
    """Return ``cls.NAME``, or raise ``TypeError`` saying why it cannot route payloads."""
    name = getattr(cls, "NAME", None)
    if not isinstance(name, str) or not name.strip():
        raise TypeError(
            f"job class {cls.__qualname__} needs a NAME: a non-empty string that routes payloads to it (got {name!r})"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise TypeError(
            f"job class {cls.__qualname__}: NAME is {len(name)} characters long, at most {MAX_NAME_LENGTH} fit "
            f"the jobs table (got {name[:40]!r}…)"
        )
    if not name.isprintable():
        # NUL, control characters and lone surrogates: no database stores
        # them all, and a NAME is shown in logs and by the CLI.
        raise TypeError(f"job class {cls.__qualname__}: NAME {name!r} must be printable characters only")
    return name


def check_max_attempts(cls: type) -> int:
    """Return ``cls.MAX_ATTEMPTS``, or raise ``TypeError`` unless it is an int >= 1."""
    attempts = getattr(cls, "MAX_ATTEMPTS", None)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise TypeError(
            f"job class {cls.__qualname__}: MAX_ATTEMPTS must be an int >= 1 (total runs), got {attempts!r}"
        )
    return attempts


def check_priority(value: object, what: str) -> int:
    """``value`` as a priority; ``TypeError`` naming ``what`` unless it is an int from -100 to 100."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise TypeError(
            f"{what} must be an int from {MIN_PRIORITY} to {MAX_PRIORITY} (higher runs first), got {value!r}"
        )
    return value


def check_timeout(value: object, what: str) -> float | None:
    """``value`` as seconds, or None; ``TypeError`` naming ``what`` unless it is a number > 0 or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise TypeError(f"{what} must be a number of seconds > 0 (or None), got {value!r}")
    return float(value)


def check_keep_result(value: object, what: str) -> float:
    """``value`` as seconds; ``TypeError`` naming ``what`` unless it is a number >= 0 (0: keep nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise TypeError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return float(value)
