"""Backoff by value: pure functions, no waiting."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import tenacity

import syncjobs


def test_backoff_doubles_from_one_second_and_caps_at_1024() -> None:
    assert [syncjobs.retry_backoff(n) for n in range(12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1024]
    assert syncjobs.MAX_BACKOFF == 1024


@pytest.mark.parametrize("huge", [11, 64, 1_000, 10**18, sys.maxsize, 10**100])
def test_huge_attempt_numbers_clamp_without_overflow(huge: int) -> None:
    assert syncjobs.retry_backoff(huge) == 1024.0


def test_backoff_is_a_float() -> None:
    assert isinstance(syncjobs.retry_backoff(3), float)


def test_a_negative_attempt_is_a_bug_in_the_caller() -> None:
    with pytest.raises(ValueError, match="failed_attempt must be >= 0"):
        syncjobs.retry_backoff(-1)


def test_wait_seconds_speaks_tenacity_strategies() -> None:
    chain = tenacity.wait_chain(tenacity.wait_fixed(3), tenacity.wait_fixed(10))
    assert [syncjobs.wait_seconds(chain, n) for n in range(3)] == [3.0, 10.0, 10.0]
    combined = tenacity.wait_fixed(1) + tenacity.wait_incrementing(start=0, increment=2)
    assert [syncjobs.wait_seconds(combined, n) for n in range(3)] == [1.0, 3.0, 5.0]


def test_the_default_backoff_matches_tenacity_waits_it_is_built_on() -> None:
    # The same schedule as a tenacity Retrying with the same strategy, whose
    # sleep is recorded instead of slept.
    intervals: list[float] = []
    attempts = iter(range(6))

    @tenacity.retry(
        wait=tenacity.wait_exponential(multiplier=1, min=1, max=1024),
        stop=tenacity.stop_after_attempt(6),
        sleep=intervals.append,
        reraise=True,
    )
    def flaky() -> None:
        if next(attempts) < 5:
            raise OSError("transient")

    flaky()
    assert intervals == [syncjobs.retry_backoff(n) for n in range(5)]


def test_a_jobs_default_wait_is_retry_backoff() -> None:
    @dataclasses.dataclass
    class Plain(syncjobs.Job):
        NAME = "tests.retry.plain"

    job = Plain()
    assert [job.retry_wait(n) for n in (0, 3, 50)] == [1.0, 8.0, 1024.0]
