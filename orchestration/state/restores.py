"""kombu's stock Redis transports put unacknowledged messages back on Duet's schedule,
also on kombu before 5.7, which ignores the transport options that set it.

Those releases look for messages past the visibility timeout every 10 s and scan on every
10th look: a dead worker's message came back after ~100 s, whatever the timeout.
:class:`ScheduledQoS` scans every ``unacked_restore_throttle`` looks and :func:`schedule`
looks every ``unacked_restore_interval`` s (:func:`~orchestration.state.broker.broker_config`).
"""

from __future__ import annotations

import weakref
from typing import Any

from kombu.transport import redis as kombu_redis

#: The transport options (kombu 5.7's names) the channels take, for kombu before 5.7.
OPTIONS = ("unacked_restore_interval", "unacked_restore_throttle")
#: Whether kombu reads :data:`OPTIONS` itself (5.7 on): then :func:`schedule` adds nothing.
KOMBU_SCHEDULES = hasattr(kombu_redis.Channel, "unacked_restore_interval")
#: kombu's own period and throttle, for a channel given neither option.
KOMBU_INTERVAL_S = KOMBU_THROTTLE = 10

#: Each event loop's look timer (one per loop: a reconnect replaces it, not adds one).
_timers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def channel_options(base: tuple[str, ...]) -> Any:
    """A channel's ``from_transport_options``: kombu's ``base`` and :data:`OPTIONS` (typed
    Any, as kombu types its tuple by its length, and a longer one is another type)."""
    return (*base, *OPTIONS)


class ScheduledQoS(kombu_redis.QoS):
    """kombu's QoS, scanning for messages to restore every ``unacked_restore_throttle``
    looks (its channel's option) instead of every 10th."""

    def restore_visible(self, start: int = 0, num: int | None = 10, interval: int = 10) -> None:
        throttle = getattr(self.channel, "unacked_restore_throttle", interval)
        super().restore_visible(start, num, throttle)  # type: ignore[no-untyped-call]


def schedule(transport: Any, loop: Any) -> None:
    """Look for messages to restore on ``transport`` every ``unacked_restore_interval`` s
    of its options, on the event loop ``loop`` (kombu before 5.7; 5.7 does it itself)."""
    if KOMBU_SCHEDULES:
        return
    options = transport.client.transport_options
    interval = options.get("unacked_restore_interval", KOMBU_INTERVAL_S)
    stale = _timers.pop(loop, None)
    if stale is not None:  # the previous connection's
        stale.cancel()
    _timers[loop] = loop.call_repeatedly(interval, transport.cycle.maybe_restore_messages)
