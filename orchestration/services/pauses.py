"""What one worker process knows of its models' fleet-wide pauses, and for how long it
trusts that without reading Redis again.

A vendor's 429 with Retry-After pauses a model for the whole fleet (a key with a TTL, see
``orchestration.state.ratelimits``). Pauses are rare, so reading that key on every call
is mostly wasted: :class:`PauseMemory` notes each answer — a read of the key, or a pause
this process set itself — with when it was learned, and a step's begin script may skip
the read of a key learned less than ``recheck_s`` ago (the step then goes by the memory).

The trade-off: a pause another process sets is obeyed here within ``recheck_s`` at most;
a call in between may get a 429 of its own, which pauses it as before. ``recheck_s`` 0:
every call reads the key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class PauseMemory:
    """Per pause key: when it was last learned and until when the model is paused.

    Thread-safe. ``clock`` is a monotonic clock in seconds (``time.monotonic``).
    """

    def __init__(self, recheck_s: float, clock: Callable[[], float]) -> None:
        self.recheck_s = recheck_s
        self._clock = clock
        self._lock = threading.Lock()
        #: key -> (learned at, paused until), both on ``clock``.
        self._known: dict[str, tuple[float, float]] = {}

    def fresh(self) -> tuple[str, ...]:
        """The keys learned less than ``recheck_s`` ago: their reads may be skipped."""
        if self.recheck_s <= 0:
            return ()
        now = self._clock()
        with self._lock:
            return tuple(k for k, (at, _) in self._known.items() if now - at < self.recheck_s)

    def learned(self, key: str, paused_s: float) -> None:
        """Note that ``key``'s model is paused for ``paused_s`` seconds from now (0: not
        paused): the answer of a read, or the pause this process just set (in force)."""
        now = self._clock()
        with self._lock:
            self._known[key] = (now, now + max(paused_s, 0.0))

    def paused_s(self, key: str) -> float:
        """Seconds left of ``key``'s pause as last learned; 0.0 when none (or never learned)."""
        now = self._clock()
        with self._lock:
            _, until = self._known.get(key, (now, now))
        return max(until - now, 0.0)
