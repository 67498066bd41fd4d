"""kombu's stock transports restore a dead worker's messages on Duet's schedule
(orchestration.state.restores): before kombu 5.7 they came back only after ~100 s."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import fakeredis
import pytest

from orchestration.state import restores
from orchestration.state.broker import QoS, SentinelChannel, StockChannel


class _Channel:
    """What kombu's QoS reads of its channel to look for messages to restore."""

    visibility_timeout = 60
    unacked_key, unacked_index_key = "unacked", "unacked_index"
    unacked_mutex_key, unacked_mutex_expire = "unacked_mutex", 300
    do_restore = False  # kombu's QoS restores at exit unless told not to

    def __init__(self, throttle: int) -> None:
        self.unacked_restore_throttle = throttle
        self.scans = 0
        self.client = fakeredis.FakeRedis()

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        self.scans += 1  # each scan takes a connection; a skipped look does not
        yield self.client


@pytest.mark.parametrize(("throttle", "scans"), [(1, 5), (10, 1)])
def test_the_qos_scans_every_throttle_looks_of_its_channel(throttle: int, scans: int) -> None:
    channel = _Channel(throttle)
    qos = restores.ScheduledQoS(channel)
    for _ in range(5):
        qos.restore_visible(num=10)  # as kombu's poller looks, with kombu's default throttle
    assert channel.scans == scans


def test_the_stock_channels_take_the_schedule_from_the_transport_options() -> None:
    for channel in (StockChannel, SentinelChannel):
        assert set(restores.OPTIONS) <= set(channel.from_transport_options)
        assert channel.QoS is QoS


class _Timer:
    def __init__(self, every_s: float, call: Callable[[], None]) -> None:
        self.every_s, self.call, self.cancelled = every_s, call, False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    def __init__(self) -> None:
        self.timers: list[_Timer] = []

    def call_repeatedly(self, every_s: float, call: Callable[[], None]) -> _Timer:
        self.timers.append(_Timer(every_s, call))
        return self.timers[-1]


class _Transport:
    def __init__(self, options: dict[str, Any]) -> None:
        self.client = type("Client", (), {"transport_options": options})()
        self.cycle = type("Cycle", (), {"maybe_restore_messages": lambda self: None})()


def test_the_loop_looks_every_interval_and_a_reconnect_replaces_the_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(restores, "KOMBU_SCHEDULES", False)
    loop = _Loop()
    first, second = _Transport({"unacked_restore_interval": 2}), _Transport({})
    restores.schedule(first, loop)
    restores.schedule(second, loop)  # the consumer reconnected
    assert [t.every_s for t in loop.timers] == [2, restores.KOMBU_INTERVAL_S]
    assert [t.cancelled for t in loop.timers] == [True, False]
    assert loop.timers[1].call == second.cycle.maybe_restore_messages


def test_nothing_is_added_where_kombu_reads_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restores, "KOMBU_SCHEDULES", True)
    loop = _Loop()
    restores.schedule(_Transport({"unacked_restore_interval": 2}), loop)
    assert loop.timers == []
