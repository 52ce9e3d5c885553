from __future__ import annotations

import logging

import pytest

import syncjobs


def test_from_settings_builds_the_memory_queue_by_default() -> None:
    queue = syncjobs.from_settings({})
    assert isinstance(queue, syncjobs.InMemoryJobQueue)
    assert (queue.workers, queue.shutdown_grace) == (4, syncjobs.DEFAULT_SHUTDOWN_GRACE)


def test_from_settings_reads_every_key() -> None:
    queue = syncjobs.from_settings(
        {
            "backend": "memory",
            "url": "memory://",
            "concurrency": 7,
            "shutdown_grace": 1.5,
            "timeout": 30,
            "keep_result": 60,
        }
    )
    assert isinstance(queue, syncjobs.InMemoryJobQueue)
    assert (queue.workers, queue.shutdown_grace, queue.timeout, queue.keep_result) == (7, 1.5, 30.0, 60.0)
    defaults = syncjobs.from_settings({})
    assert defaults.timeout is None  # type: ignore[attr-defined]
    assert defaults.keep_result == syncjobs.DEFAULT_KEEP_RESULT == 600  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"backend": "redis"}, "unknown backend 'redis'"),
        ({"concurency": 4}, r"unknown settings key\(s\) 'concurency'"),
        ({"concurrency": -1}, "bad settings: workers must be an int >= 0"),
        ({"concurrency": "4"}, "bad settings: workers must be an int >= 0"),
        ({"shutdown_grace": -2}, "bad settings: shutdown_grace must be a number of seconds"),
        ({"timeout": 0}, r"bad settings: timeout must be a number of seconds > 0 \(or None\), got 0"),
        ({"keep_result": -1}, r"bad settings: keep_result must be a number of seconds >= 0, got -1"),
        ({"url": "postgresql://db/app"}, "the memory backend takes no url"),
    ],
)
def test_from_settings_refuses_what_it_does_not_know(settings: dict[str, object], message: str) -> None:
    with pytest.raises(syncjobs.QueueError, match=message):
        syncjobs.from_settings(settings)


def test_from_settings_refuses_a_non_mapping() -> None:
    with pytest.raises(syncjobs.QueueError, match="settings must be a mapping, got list"):
        syncjobs.from_settings([("backend", "memory")])  # type: ignore[arg-type]


def test_inmemory_from_settings_warns_and_uses_memory(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="syncjobs")
    queue = syncjobs.inmemory_from_settings({"backend": "postgresql", "url": "postgresql://db/app", "concurrency": 2})
    assert isinstance(queue, syncjobs.InMemoryJobQueue)
    assert queue.workers == 2
    assert [r.getMessage() for r in caplog.records] == [
        "settings name the 'postgresql' backend; using an in-memory queue instead"
    ]


def test_inmemory_from_settings_defaults_to_four_workers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="syncjobs")
    assert syncjobs.inmemory_from_settings({}).workers == 4
    assert caplog.records == []


def test_connect_memory_url() -> None:
    queue = syncjobs.connect("memory://", workers=3)
    assert isinstance(queue, syncjobs.InMemoryJobQueue)
    assert queue.workers == 3
    with pytest.raises(syncjobs.QueueError, match="no database backend for the URL 'ftp://x'"):
        syncjobs.connect("ftp://x")


def test_constructor_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="workers must be an int >= 0"):
        syncjobs.InMemoryJobQueue(-1)
    with pytest.raises(ValueError, match="shutdown_grace must be a number of seconds"):
        syncjobs.InMemoryJobQueue(shutdown_grace=float("nan"))
