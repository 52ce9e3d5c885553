"""The keys that unique jobs and limits are made of: named payload fields, a function of the payload, or all of it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import QueueError

KeyFunction = Callable[[dict[str, Any]], Any]


def check_key_spec(what: str, fields: tuple[str, ...], key: KeyFunction | None) -> None:
    """``TypeError`` unless ``fields`` are distinct names and ``key`` (not with fields) a function."""
    for field in fields:
        if not isinstance(field, str) or not field:
            raise TypeError(f"{what}: fields are payload field names (strings), got {field!r}")
    if len(set(fields)) != len(fields):
        raise TypeError(f"{what}: a field is named twice in {fields!r}")
    if fields and key is not None:
        raise TypeError(f"{what}: give payload fields or a key function, not both")
    if key is not None and not callable(key):
        raise TypeError(f"{what}: key must be a function of the payload, got {key!r}")


def check_known_fields(declared: str, fields: tuple[str, ...], known: Iterable[str] | None, what: str) -> None:
    """``TypeError`` for a field not among ``known`` (a dataclass's fields, a function's parameters)."""
    if known is None:
        return
    names = list(known)
    missing = [field for field in fields if field not in names]
    if missing:
        raise TypeError(f"{what}: {declared} names {', '.join(map(repr, missing))}, not among {names}")


def key_digest(
    kind: str,
    name: str,
    values: Mapping[str, Any],
    *,
    fields: tuple[str, ...],
    key: KeyFunction | None,
    scope: str,
) -> str:
    """The SHA-256 (hex) of the job's key of ``kind`` ("unique key", "limit key"); ``QueueError`` naming the job."""
    if fields:
        missing = [field for field in fields if field not in values]
        if missing:
            raise QueueError(
                f"job {name!r}: its {kind}'s field(s) {', '.join(map(repr, missing))} are not in its payload"
            )
        part: Any = [values[field] for field in fields]
    elif key is not None:
        try:
            part = key(dict(values))
        except Exception as exc:
            raise QueueError(f"job {name!r}: its {kind} function raised {type(exc).__name__}: {exc}") from exc
    else:
        part = values
    # The kind is in the hash: a job's unique key and its limit key never meet, even in one table.
    marked = [scope, name, part] if kind == "unique key" else [scope, name, part, kind]
    try:
        text = json.dumps(marked, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise QueueError(f"job {name!r}: its {kind} must be JSON: {exc}") from exc
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
