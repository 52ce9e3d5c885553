"""Job ids are UUIDv7 strings: canonical, time-ordered, and carrying their creation time."""

from __future__ import annotations

import time
import uuid

import pytest

from syncjobs.ids import created_at, new_job_id

pytestmark = pytest.mark.timeout(30)


def test_an_id_is_a_canonical_uuid_of_version_7_with_the_rfc_variant() -> None:
    for _ in range(2_000):
        job_id = new_job_id()
        parsed = uuid.UUID(job_id)
        assert str(parsed) == job_id  # lower-case hex, dashes where a UUID has them
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122


def test_an_id_tells_when_it_was_made_to_the_millisecond() -> None:
    before = time.time()
    job_id = new_job_id()
    after = time.time()
    made = created_at(job_id)
    assert made is not None
    assert int(before * 1000) / 1000 <= made <= after
    assert created_at("not-a-uuid") is None
    assert created_at(str(uuid.uuid4())) is None  # random bits where a UUIDv7 has its time


def test_ids_made_in_later_milliseconds_sort_after_earlier_ones() -> None:
    first = new_job_id()
    stamp = created_at(first)
    deadline = time.monotonic() + 5
    later = first
    while created_at(later) == stamp:  # a polled condition: the next millisecond
        assert time.monotonic() < deadline
        later = new_job_id()
    assert later > first


def test_ids_do_not_repeat() -> None:
    ids = [new_job_id() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
