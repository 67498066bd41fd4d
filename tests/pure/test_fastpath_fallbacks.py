"""Each fast path, switched off, leaves the stock library class in its place: kombu's
Redis channel, Celery's AMQP, Celery's ``send_task``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis
from celery.signals import after_task_publish, before_task_publish
from kombu.transport import redis as kombu_redis

from orchestration.settings import Settings, get_settings
from orchestration.state import broker, connection, fastpaths
from workers import celery_ext

URL = "redis://cache:6379/0"


@pytest.fixture
def switch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set ``DUET_FAST_PATHS`` for this test (decided afresh)."""

    def set_to(value: str) -> None:
        monkeypatch.setenv(fastpaths.SWITCH, value)
        fastpaths.reset()

    yield set_to
    fastpaths.reset()


def needs(name: str) -> None:
    """Skip where fast path ``name`` cannot be forced on (a release lacking its names)."""
    missing = fastpaths.missing_names(fastpaths.FAST_PATHS[name])
    if missing:
        pytest.skip(f"the installed release lacks {', '.join(missing)}")


def _channel_class(transport: str | None) -> Any:
    return kombu.Connection(URL, transport=transport).transport.Channel


@pytest.mark.parametrize("value", ["off", "on,-transport", "auto,-transport"])
def test_off_the_broker_is_kombus_stock_redis_transport(switch: Any, value: str) -> None:
    switch(value)
    config = broker.broker_config(URL, Settings())
    assert config["broker_transport"] == broker.STOCK_TRANSPORT
    # kombu's channel, its unacknowledged messages in Duet's format (as a fast-path
    # worker's): either restores what the other died holding.
    channel = _channel_class(config["broker_transport"])
    assert channel is broker.StockChannel and channel.__bases__ == (kombu_redis.Channel,)
    assert channel.QoS is broker.QoS
    # The same key names as a fast-path process: one deployment, one set of queues.
    assert config["broker_transport_options"]["global_keyprefix"] == "duet."
    # Shown as redis:// still (Flower picks its broker client by the scheme).
    assert celery_ext.amqp() is celery_ext.AMQP
    connection = celery_ext.AMQP.Connection(URL, transport=config["broker_transport"])
    assert connection.as_uri().startswith("redis://")


def test_on_the_broker_is_duets_transport(switch: Any) -> None:
    needs("transport")
    switch("on")
    config = broker.broker_config(URL, Settings())
    assert _channel_class(config["broker_transport"]) is broker.Channel
    assert celery_ext.amqp() is celery_ext.AMQP


def test_an_untested_kombu_runs_the_stock_transport(
    switch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    switch("auto")
    real = fastpaths.installed_version
    monkeypatch.setattr(
        fastpaths, "installed_version", lambda p: "5.8.0" if p == "kombu" else real(p)
    )
    assert broker.broker_config(URL, Settings())["broker_transport"] == broker.STOCK_TRANSPORT


def test_the_consumer_and_the_run_state_pool_are_the_stock_ones(switch: Any) -> None:
    """The ``consumer`` and ``pool`` fast paths saved nothing measurable: gone."""
    switch("on")
    from workers.app import app

    assert app.conf.worker_consumer == "celery.worker.consumer:Consumer"
    connection.reset()
    connection.use_redis(URL)  # no connection is made until a command
    try:
        assert type(connection.get_redis().connection_pool) is redis.BlockingConnectionPool
    finally:
        connection.reset()


@pytest.fixture
def app_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``workers.app`` configured for a Redis broker (reconfigured afterwards)."""
    import workers.app  # noqa: F401

    module = sys.modules["workers.app"]  # `workers.app` the attribute is the Celery app
    monkeypatch.setenv("DUET_REDIS_URL", URL)
    monkeypatch.delenv("DUET_BROKER_URL", raising=False)
    get_settings.cache_clear()
    yield module
    fastpaths.reset()
    get_settings.cache_clear()
    module.configure()


@pytest.mark.parametrize(
    ("value", "direct"), [("on", True), ("off", False), ("on,-publish", False)]
)
def test_the_tasks_send_through_celery_when_publish_is_off(
    switch: Any, app_module: Any, value: str, direct: bool
) -> None:
    needs("publish")
    needs("transport")
    switch(value)
    app_module.configure(redis_url=URL)
    assert app_module.direct_push() is direct


@pytest.mark.parametrize(
    "signal",
    [before_task_publish, after_task_publish],
    ids=["before_task_publish", "after_task_publish"],
)
def test_a_publish_signal_receiver_turns_the_direct_push_off(
    switch: Any, app_module: Any, signal: Any
) -> None:
    needs("publish")
    needs("transport")
    switch("on")
    app_module.configure(redis_url=URL)
    assert app_module.direct_push()

    def receiver(**_: Any) -> None:
        pass

    signal.connect(receiver)
    try:
        assert not app_module.direct_push()  # send_task, which sends the signals
    finally:
        signal.disconnect(receiver)
    assert app_module.direct_push()
