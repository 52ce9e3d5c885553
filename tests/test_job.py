"""Jobs, their payloads and the error family, without a queue."""

from __future__ import annotations

import dataclasses
import sys

import pytest

import syncjobs
from syncjobs.payload import decode, encode


@dataclasses.dataclass
class Email(syncjobs.Job):
    NAME = "tests.email"
    MAX_ATTEMPTS = 3
    to: str
    cc: list[str] = dataclasses.field(default_factory=list)
    derived: int = dataclasses.field(default=0, init=False)


def test_error_strings_say_their_kind() -> None:
    assert str(syncjobs.Retryable("smtp busy")) == "retryable: smtp busy"
    assert str(syncjobs.Fatal("no such user")) == "fatal: no such user"
    assert str(syncjobs.QueueError("bad payload")) == "queue error: bad payload"
    for error in (syncjobs.Retryable, syncjobs.Fatal, syncjobs.QueueError):
        assert issubclass(error, syncjobs.JobError)
        assert issubclass(error, Exception)


def test_a_dataclass_round_trips_through_its_payload() -> None:
    job = Email("ada@example.com", ["bob@example.com"])
    payload = job.to_payload()
    assert payload == {"to": "ada@example.com", "cc": ["bob@example.com"]}  # init=False is derived
    back = Email.from_payload(decode(encode(job)))
    assert back == job
    assert back is not job


def test_defaults_of_the_class() -> None:
    assert syncjobs.Job.MAX_ATTEMPTS == syncjobs.DEFAULT_MAX_ATTEMPTS == 5
    assert Email.MAX_ATTEMPTS == 3


def test_a_subclass_may_override_the_payload_methods() -> None:
    class Custom(syncjobs.Job):
        NAME = "tests.custom"

        def __init__(self, numbers: tuple[int, ...]) -> None:
            self.numbers = numbers

        def to_payload(self) -> dict[str, object]:
            return {"numbers": list(self.numbers)}

        @classmethod
        def from_payload(cls, data: dict[str, object]) -> Custom:
            numbers = data["numbers"]
            assert isinstance(numbers, list)
            return cls(tuple(numbers))

    back = Custom.from_payload(decode(encode(Custom((1, 2)))))
    assert back.numbers == (1, 2)


def test_encode_names_the_job_when_to_payload_raises() -> None:
    @dataclasses.dataclass
    class Broken(syncjobs.Job):
        NAME = "tests.broken"

        def to_payload(self) -> dict[str, object]:
            raise RuntimeError("oops")

    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.broken': to_payload\(\) raised RuntimeError: oops"):
        encode(Broken())


def test_decode_refuses_anything_but_an_object() -> None:
    with pytest.raises(ValueError, match="must be a JSON object"):
        decode("[1, 2]")


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, {"b": "é"}]}',  # as PostgreSQL's jsonb writes it
        ' {"a":[1,{"b":"é"}]}',
        '{"a":[1,{"b":"é"}]}\n',
        '{\n  "a": [\n    1,\n    {"b": "é"}\n  ]\n}',
    ],
)
def test_decode_reads_json_text_with_whitespace_around_and_within(text: str) -> None:
    assert decode(text) == {"a": [1, {"b": "é"}]}


@pytest.mark.parametrize("text", ["", "{", '{"a":1} x', '{"a":1}{"b":2}', "nan"])
def test_decode_refuses_what_is_not_one_json_object(text: str) -> None:
    with pytest.raises(ValueError, match=r"Expecting|Extra data|must be a JSON object"):
        decode(text)


def test_a_payload_that_contains_itself_is_named_as_a_cycle() -> None:
    @dataclasses.dataclass
    class Loop(syncjobs.Job):
        NAME = "tests.loop"
        items: list[object]

    items: list[object] = [1]
    items.append(items)
    with pytest.raises(syncjobs.QueueError, match=r"job 'tests.loop': .* field 'items\[1\]' contains itself"):
        encode(Loop(items))


def test_a_cycle_is_found_at_once_whatever_the_recursion_limit() -> None:
    # Found by the encoder's own record of what it is inside, not by recursing to the limit: with a
    # raised limit, recursing that deep may crash the interpreter (a small thread stack, say).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:

        @dataclasses.dataclass
        class Loop(syncjobs.Job):
            NAME = "tests.loop_deep"
            items: dict[str, object]

        items: dict[str, object] = {}
        items["self"] = [items]
        with pytest.raises(syncjobs.QueueError, match=r"field 'items\.self\[0\]' contains itself"):
            encode(Loop(items))
    finally:
        sys.setrecursionlimit(limit)


def test_run_must_be_written() -> None:
    @dataclasses.dataclass
    class Lazy(syncjobs.Job):
        NAME = "tests.lazy"

    with pytest.raises(NotImplementedError, match="Lazy must define run"):
        Lazy().run()


def test_dead_letters_are_frozen() -> None:
    dead = syncjobs.DeadLetter("id", "name", {}, 1, "fatal: x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        dead.error = "changed"  # type: ignore[misc]


@dataclasses.dataclass
class Scalars(syncjobs.Job):
    NAME = "tests.scalars"
    text: str
    number: int
    ratio: float
    flag: bool
    nothing: None
    items: list[object]
    mapping: dict[str, object]

    def run(self) -> None:
        pass


@pytest.mark.parametrize(
    "job",
    [
        Scalars("héllo ✓ 日本", 10**40, -0.0, True, None, [], {}),
        Scalars("", -(2**63), 5e-324, False, None, [1, 2.5, "x", None, True], {"a": 1, "b": "c", "d": None}),
        Scalars('\u0000\n"', 0, 1.7976931348623157e308, True, None, ["é", 0.1 + 0.2], {"é": 1e-7}),
    ],
)
def test_a_payload_of_scalars_lists_and_dicts_comes_back_equal_and_of_the_same_types(job: Scalars) -> None:
    # Such payloads are accepted without a round trip at dispatch: what a run gets back must be them exactly.
    payload = job.to_payload()
    back = decode(encode(job))
    assert back == payload
    assert _types(back) == _types(payload)


def _types(value: object) -> object:
    if isinstance(value, dict):
        return {key: _types(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_types(item) for item in value]
    return (type(value), repr(value))
