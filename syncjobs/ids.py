"""Job ids: UUIDv7 strings, time-ordered so that a database index on them stays compact."""

from __future__ import annotations

import random
import time

_RANDOM_BITS = (1 << 62) - 1


def new_job_id() -> str:
    """A UUIDv7 (RFC 9562) as the canonical 36-character string.

    Built by hand rather than with ``uuid.UUID``, whose constructor costs more
    than the rest of ``dispatch()`` put together.  The random bits come from
    the ``random`` module, which reseeds in a forked child; ids need to be
    unique, not secret.
    """
    millis = time.time_ns() // 1_000_000
    rand = random.getrandbits(74)
    value = (millis << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & _RANDOM_BITS)
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def created_at(job_id: str) -> float | None:
    """Epoch seconds when :func:`new_job_id` made ``job_id`` (its first 48 bits); None for another kind of id."""
    try:
        return int(job_id[:8] + job_id[9:13], 16) / 1000
    except ValueError:
        return None
