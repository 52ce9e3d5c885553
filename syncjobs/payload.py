"""JSON encoding of job payloads, refusing at dispatch what would not come back intact."""

from __future__ import annotations

import json
import json.encoder
import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .envelope import DeadLetter
from .errors import QueueError
from .job import Job

# allow_nan=False: NaN and Infinity are not JSON; other parsers reject them.
_encoder = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_decode = json.loads


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The C encoder behind _encoder, made once per thread: JSONEncoder.encode()
# builds one (and a closure) for every call, which cost more than the
# encoding itself. Per thread, because its dict of the containers being
# encoded (what finds a cycle at once) is its own. Without that dict, a
# payload that contains itself would recurse to the recursion limit, which
# with a raised limit or a small thread stack can crash the interpreter.
_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_per_thread = threading.local()


def _encode_text(payload: dict[str, Any]) -> str:
    if _c_encoder is None:
        return _encoder.encode(payload)
    try:
        encode_chunks, markers = _per_thread.encoder
    except AttributeError:
        markers = {}
        encode_chunks = _c_encoder(
            markers, _refuse, json.encoder.encode_basestring, None, ":", ",", False, False, False
        )
        _per_thread.encoder = encode_chunks, markers
    try:
        return "".join(encode_chunks(payload, 0))
    except BaseException:
        markers.clear()  # what the failed call was encoding stays in it
        raise


#: The most characters of JSON a job's result may be: results are kept in the
#: database for status() (a big value belongs in storage of its own, its key in the result).
MAX_RESULT = 1_000_000

# A lone surrogate: Python strings can hold one, UTF-8 (and so every database
# driver) cannot; the memory backend refuses it too, so that backends agree.
_SURROGATE = re.compile("[\ud800-\udfff]")
# The C scanner behind json.loads, without its type checks and whitespace
# regexes: for text that _encoder just wrote, which has no whitespace around it.
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def encode(job: Job) -> str:
    """The job's payload as JSON text, or ``QueueError`` naming the job and the field.

    A payload must survive the round trip unchanged: a tuple that would come
    back a list, or an int key that would come back a string, is refused here
    rather than surprising the job at run time.
    """
    try:
        payload = job.to_payload()
    except Exception as exc:
        raise QueueError(f"job {job.NAME!r}: to_payload() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(payload, dict):
        raise QueueError(f"job {job.NAME!r}: to_payload() must return a dict, got {type(payload).__name__}")
    try:
        text = _encode_text(payload)
    except (TypeError, ValueError) as exc:
        raise QueueError(f"job {job.NAME!r}: payload is not JSON-serializable: {describe_problem(payload)}") from exc
    except RecursionError as exc:
        raise QueueError(f"job {job.NAME!r}: payload is nested too deeply for JSON") from exc
    if not text.isascii() and _SURROGATE.search(text):
        raise QueueError(f"job {job.NAME!r}: payload is not valid Unicode: {describe_problem(payload)}")
    if _plain(payload):
        return text
    try:
        decoded, end = _scan_once(text, 0)
    except RecursionError as exc:
        raise QueueError(f"job {job.NAME!r}: payload is nested too deeply for JSON") from exc
    if end != len(text) or decoded != payload:
        raise QueueError(f"job {job.NAME!r}: payload does not survive a JSON round trip: {describe_problem(payload)}")
    # The decoded copy is not kept for the first run: it would double a pending job's memory.
    return text


# Types JSON gives back as they were, equal, once encoded (a float is finite: the encoder refused the rest;
# a str holds no lone surrogate: encode() refused it). Exact types: a subclass comes back as its base.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(payload: dict[str, Any]) -> bool:
    """Whether ``payload`` comes back from JSON equal without a round trip to prove it: true of most payloads.

    That is a dict of string keys whose values are scalars, or lists or dicts
    (of string keys) of scalars: what a job's fields, or a task's arguments
    (``{"args": [...], "kwargs": {...}}``), mostly are. A round trip costs
    more than the rest of a dispatch's checks; anything else takes it.
    """
    for key, value in payload.items():
        kind = type(value)
        if type(key) is not str:
            return False
        if kind in _SCALARS:
            continue
        if kind is list:
            for item in value:
                if type(item) not in _SCALARS:
                    return False
        elif kind is dict:
            for inner_key, item in value.items():
                if type(inner_key) is not str or type(item) not in _SCALARS:
                    return False
        else:
            return False
    return True


def encode_result(value: Any) -> str:
    """What a run returned, as JSON text; ``QueueError`` saying why it cannot be kept.

    Laxer than a payload: a tuple is kept as a list and an int key as a
    string (what ``json.dumps`` does): the run's work is done either way.
    """
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except RecursionError as exc:
        raise QueueError("returned a value nested too deeply for JSON") from exc
    except Exception as exc:
        raise QueueError(f"returned a value that is not JSON: {type(exc).__name__}: {exc}") from exc
    if len(text) > MAX_RESULT:
        raise QueueError(f"returned {len(text):,} characters of JSON, more than the {MAX_RESULT:,} a result may be")
    return text  # ASCII (ensure_ascii): even a lone surrogate is stored as its escape


def decode(text: str | bytes) -> dict[str, Any]:
    """The payload dict back from its JSON text (or that text's UTF-8 bytes)."""
    if isinstance(text, bytes):
        text = text.decode()
    try:
        data, end = _scan_once(text, 0)
    except StopIteration:  # not JSON where it starts (leading whitespace, say)
        end = -1
    if end != len(text):
        data = _decode(text)
    if not isinstance(data, dict):
        raise ValueError(f"payload must be a JSON object, got {type(data).__name__}")
    return data


def dead_letter_from_text(job_id: str, name: str, payload: str | bytes, attempts: int, error: str) -> DeadLetter:
    """The DeadLetter of a job whose payload is JSON text.

    A payload that is not a JSON object (the reason it died, maybe) shows as
    ``{}``: a dead-letter handler must get its letter whatever the payload.
    """
    try:
        data = decode(payload)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to decode
        data = {}
    return DeadLetter(job_id, name, data, attempts, error)


def describe_problem(payload: dict[str, Any]) -> str:
    """Name the first field, by path, that JSON cannot carry unchanged, and why."""
    try:
        problem = _find(payload, "", set())
    except RecursionError:
        return "the payload is nested too deeply to say where"
    return problem or "a value changes in the round trip"


def describe_arguments(arguments: Mapping[str, Any]) -> str | None:
    """Name the first argument of a call, by path, that JSON cannot carry unchanged, and why; None if none."""
    try:
        return _first(_find(value, name, set(), noun="argument") for name, value in arguments.items())
    except RecursionError:
        return "an argument is nested too deeply for JSON"


def _find(value: Any, path: str, seen: set[int], noun: str = "field") -> str | None:
    where = f"{noun} {path!r}" if path else "the payload"
    if isinstance(value, str):
        return _surrogate_in(where, value)
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is {value!r}, which JSON cannot represent"
    if isinstance(value, (dict, list)):
        if id(value) in seen:
            return f"{where} contains itself (a reference cycle)"
        seen = seen | {id(value)}
        if isinstance(value, list):
            return _first(_find(item, f"{path}[{index}]", seen, noun) for index, item in enumerate(value))
        return _first(_find_in_item(where, path, key, item, seen, noun=noun) for key, item in value.items())
    if isinstance(value, tuple):
        return f"{where} is a tuple, which comes back from JSON as a list"
    return f"{where} is {a_kind(value)}, which is not JSON-serializable"


def a_kind(value: object) -> str:
    """The type of ``value`` with its article, as a message says it: 'an int', 'a str'."""
    kind = type(value).__name__
    return f"{'an' if kind[:1] in 'aeiouAEIOU' else 'a'} {kind}"


def _find_in_item(where: str, path: str, key: Any, item: Any, seen: set[int], *, noun: str) -> str | None:
    if not isinstance(key, str):
        return f"{where} has the key {key!r} of type {type(key).__name__}; JSON keys are strings"
    found = _surrogate_in(f"the key {key!r} of {where}", key)
    return found or _find(item, f"{path}.{key}" if path else key, seen, noun)


def _first(problems: Iterator[str | None]) -> str | None:
    return next((problem for problem in problems if problem), None)


def _surrogate_in(where: str, text: str) -> str | None:
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (
        f"{where} holds a lone surrogate {found.group()!r} at index {found.start()}, which UTF-8 cannot "
        "encode and so no database can store (bytes decoded with errors='surrogateescape'?)"
    )
