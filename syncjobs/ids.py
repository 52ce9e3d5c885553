"""Job ids: UUIDv7 strings, time-ordered so that a database index on them stays compact."""

from __future__ import annotations

import random
import time

_LOW_48 = (1 << 48) - 1


def new_job_id() -> str:
    """A UUIDv7 (RFC 9562) as the canonical 36-character string.

    Built by hand rather than with ``uuid.UUID``, whose constructor costs more
    than the rest of ``dispatch()`` put together.  The random bits come from
    the ``random`` module, which reseeds in a forked child; ids need to be
    unique, not secret.
    """
    millis = time.time_ns() // 1_000_000
    rand = random.getrandbits(74)
    # Each group formatted apart: one % beats formatting 128 bits and slicing them.
    return "%08x-%04x-%04x-%04x-%012x" % (  # noqa: UP031
        millis >> 16,
        millis & 0xFFFF,
        0x7000 | (rand >> 62),  # version 7, then 12 random bits
        0x8000 | ((rand >> 48) & 0x3FFF),  # variant 0b10, then 14 random bits
        rand & _LOW_48,
    )


def created_at(job_id: str) -> float | None:
    """Epoch seconds when :func:`new_job_id` made ``job_id`` (its first 48 bits); None for another kind of id."""
    if len(job_id) != 36 or job_id[14] != "7":  # not a UUIDv7: its first bits are no time
        return None
    try:
        return int(job_id[:8] + job_id[9:13], 16) / 1000
    except ValueError:
        return None
