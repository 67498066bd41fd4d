"""Duet's one backoff policy: every wait before trying again is :meth:`Backoff.delay`.

A task's retry (a vendor's refusal, a Redis or broker error) takes its countdown from it;
a loop that waits in place (a Redis write, a publish) is :meth:`Backoff.retrying`, tenacity's
loop with these waits. The policies in use are the constants below and
:func:`vendor_backoff`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import tenacity


@dataclass(frozen=True)
class Backoff:
    """Waits doubling from ``first_s`` up to ``max_s`` (seconds); ``jitter`` is the share
    of each wait drawn at random: 0 none, 0.5 a wait between half and all of it, 1 "full
    jitter" (anything up to it), so a fleet that failed together does not retry together."""

    first_s: float
    max_s: float
    jitter: float = 0.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt + 1`` (``attempt`` 0: the first)."""
        cap = min(self.max_s, self.first_s * 2.0 ** min(max(attempt, 0), 64))
        return cap * (1.0 - self.jitter * random.random())

    def retrying(
        self,
        errors: tuple[type[BaseException], ...],
        patience_s: float,
        on_wait: Callable[[BaseException, float], None],
        unless: tuple[type[BaseException], ...] = (),
    ) -> tenacity.Retrying:
        """A loop that calls again after ``errors`` (but not ``unless``: they go up at
        once) with these waits, until the next wait would end past ``patience_s`` from the
        first call: then the last error goes up. ``on_wait(error, seconds)`` is told of
        each wait (to log it)."""

        def wait(state: tenacity.RetryCallState) -> float:
            return self.delay(state.attempt_number - 1)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            if error is not None:
                on_wait(error, state.upcoming_sleep)

        return tenacity.Retrying(
            retry=(
                tenacity.retry_if_exception_type(errors)
                & tenacity.retry_if_not_exception_type(unless)
            ),
            wait=wait,
            stop=tenacity.stop_before_delay(patience_s),
            before_sleep=before_sleep,
            reraise=True,
        )


#: A Redis write or a publish retried in place: 0.2 s doubling to 5 s.
IN_PLACE = Backoff(0.2, 5.0)
#: A Redis that refuses writes (out of memory, a replica ...) while the worker holds a
#: message: 0.05 s doubling to 1 s, for as long as it lasts.
OUTAGE = Backoff(0.05, 1.0)
#: A task's retry after a Redis or broker error: 1, 2, 4 ... 30 s, half of it jittered.
INFRA = Backoff(1.0, 30.0, jitter=0.5)


def vendor_backoff(first_s: float, max_s: float) -> Backoff:
    """A step's retry after a vendor's transient error (``DUET_RETRY_BASE_S`` and
    ``DUET_RETRY_MAX_S``): full jitter, as many workers retry the same vendor."""
    return Backoff(first_s, max_s, jitter=1.0)
