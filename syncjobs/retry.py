"""Retry waits: pure functions of the failed attempt's number.

tenacity already has the well-tested wait strategies (exponential, jitter,
chains); syncjobs reuses them rather than writing its own, and lets a job plug
any of them in through :func:`wait_seconds`.
"""

from __future__ import annotations

import tenacity
from tenacity.wait import wait_base

#: The longest wait between two runs of a job, in seconds.
MAX_BACKOFF = 1024.0

# 2 ** 10 == 1024: any exponent past this one is clamped before tenacity sees
# it, so a huge attempt number costs no big-integer arithmetic.
_MAX_EXPONENT = 10

_DEFAULT_WAIT = tenacity.wait_exponential(multiplier=1, exp_base=2, min=1, max=MAX_BACKOFF)

# A RetryCallState needs a retrying object, never used by the wait strategies.
_RETRYING = tenacity.Retrying()


def wait_seconds(strategy: wait_base, failed_attempt: int) -> float:
    """Seconds a tenacity wait ``strategy`` gives after the 0-based run ``failed_attempt``.

    Lets a job override its wait with any tenacity strategy::

        def retry_wait(self, failed_attempt):
            return syncjobs.wait_seconds(tenacity.wait_random_exponential(max=60), failed_attempt)
    """
    if failed_attempt < 0:
        raise ValueError(f"failed_attempt must be >= 0, got {failed_attempt}")
    state = tenacity.RetryCallState(_RETRYING, None, (), {})
    # tenacity counts attempts from 1: the run that failed is attempt_number.
    state.attempt_number = failed_attempt + 1
    return float(strategy(state))


def retry_backoff(failed_attempt: int) -> float:
    """Seconds to wait before the retry that follows the 0-based run ``failed_attempt``.

    1, 2, 4, 8 ... capped at 1024; any larger ``failed_attempt`` gives 1024.
    """
    if failed_attempt < 0:
        raise ValueError(f"failed_attempt must be >= 0, got {failed_attempt}")
    return wait_seconds(_DEFAULT_WAIT, min(failed_attempt, _MAX_EXPONENT))
