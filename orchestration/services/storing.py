"""Storing what a step paid for, on a Redis that may be away or full: tried again in place
through an outage; an answer bigger than all the room Redis has left under its
``maxmemory`` (``OOM`` once the model-call cache gave its room back) is stored as the
step's failure instead, so the run ends ``failed`` naming Redis's memory, its call charged.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from orchestration.backoff import IN_PLACE
from orchestration.defaults import STORE_PATIENCE_S
from orchestration.state.connection import INFRA_ERRORS, OUT_OF_MEMORY
from orchestration.state.room import room_of

log = logging.getLogger(__name__)
T = TypeVar("T")


def keep_trying(
    write: Callable[[], T],
    what: str,
    unless: tuple[type[BaseException], ...] = (),
    patience_s: float = STORE_PATIENCE_S,
) -> T:
    """Run ``write`` until Redis takes it (:data:`~orchestration.backoff.IN_PLACE`), for up
    to ``patience_s``; then the error goes up (the task retries). ``unless``: errors that
    go up at once. What ``write`` returned."""

    def waiting(exc: BaseException, wait: float) -> None:
        log.warning("%s: %s; again in %.1fs", what, type(exc).__name__, wait)

    result: T = IN_PLACE.retrying(INFRA_ERRORS, patience_s, waiting, unless)(write)
    return result


def store_or_fail(
    write: Callable[[], T],
    failed: Callable[[str], object],
    size: int,
    thing: str,
    what: str,
    client: Any,
    give_room: Callable[[], int] | None,
    patience_s: float = STORE_PATIENCE_S,
) -> tuple[bool, T | None]:
    """Store ``thing`` with ``write`` (``size`` bytes, about): ``(True, what it returned)``.
    Or, when Redis refuses it for memory and it needs more than all the room Redis has
    left (``client``'s server) after ``give_room`` (the model-call cache's eviction) made
    what room it could, while that room is real (Redis is not full: other writes go on),
    store ``failed(why)`` (a small write) instead: ``(False, None)``. An ``OOM`` for a
    write that would fit, or on a full Redis, is an outage that passes (memory raised or
    freed, a cache yet to give room back): tried again in place for ``patience_s`` (0:
    not at all); then the error goes up."""
    deadline = time.monotonic() + patience_s
    attempt = 0
    while True:
        try:
            return True, keep_trying(write, what, (OUT_OF_MEMORY,), patience_s)
        except OUT_OF_MEMORY:
            freed = give_room() if give_room is not None else 0
            room = room_of(client)
            if room is not None and not room.full and not room.fits(size):
                why = (
                    f"Redis is at its maxmemory (OOM): {thing} ({size:,} bytes, held twice "
                    f"while it is written) needs more than all the room Redis has left "
                    f"({max(room.left, 0):,} of maxmemory {room.maxmemory:,} bytes, after "
                    "the model-call cache gave its room back); raise maxmemory or free "
                    "memory, then run it again"
                )
                log.error("%s: %s", what, why)
                keep_trying(functools.partial(failed, why), f"{what}: failing it", (), patience_s)
                return False, None
            wait = IN_PLACE.delay(attempt)
            if time.monotonic() + wait > deadline:
                raise
            log.warning(
                "%s: Redis is full (OOM)%s; again in %.1fs",
                what,
                f", {freed} cache entries given back" if freed else "",
                wait,
            )
            time.sleep(wait)
            attempt += 1
