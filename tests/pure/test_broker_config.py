"""The broker settings every worker and client shares: each transport gets the socket
timeouts in its own terms (a frozen broker is an error, not a hang)."""

from __future__ import annotations

import pytest

from orchestration.settings import Settings
from orchestration.state import fastpaths
from orchestration.state.broker import STOCK_TRANSPORT, TRANSPORT, broker_config

SETTINGS = Settings(redis_socket_timeout_s=7, redis_connect_timeout_s=2)


@pytest.mark.parametrize(
    "url", ["amqp://guest:pw@rabbit:5672//", "amqps://rabbit//", "pyamqp://rabbit//"]
)
def test_an_amqp_broker_gets_read_and_write_timeouts(url: str) -> None:
    config = broker_config(url, SETTINGS)
    options = config["broker_transport_options"]
    # py-amqp's names: it sets them on the socket (SO_RCVTIMEO / SO_SNDTIMEO).
    assert (options["read_timeout"], options["write_timeout"]) == (7, 7)
    assert not {"socket_timeout", "socket_connect_timeout"} & set(options)  # redis-py's
    assert config["broker_connection_timeout"] == 2  # connect and handshake
    assert config["broker_transport"] is None  # kombu's own AMQP transport


@pytest.mark.parametrize("url", ["redis://cache:6379/0", "rediss://cache:6380/0"])
def test_a_redis_broker_gets_redis_py_timeouts(url: str) -> None:
    config = broker_config(url, SETTINGS)
    options = config["broker_transport_options"]
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (7, 2)
    assert not {"read_timeout", "write_timeout"} & set(options)
    # Duet's transport where its fast path runs (tested kombu), else kombu's own.
    stock = STOCK_TRANSPORT
    assert config["broker_transport"] == (TRANSPORT if fastpaths.enabled("transport") else stock)


@pytest.mark.parametrize("switch", ["on", "off"])
def test_every_broker_key_is_under_duets_prefix(
    switch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's ``global_keyprefix``: queues, unacked and binding keys (issue 23), on
    Duet's transport and kombu's stock one alike (issue 24: the stock path had lost it, so
    its workers and clients used other keys than a fast-path process and the pings)."""
    from orchestration.state import keys

    monkeypatch.setenv(fastpaths.SWITCH, switch)
    fastpaths.reset()
    try:
        config = broker_config("redis://cache:6379/0", SETTINGS)
    finally:
        monkeypatch.undo()
        fastpaths.reset()
    assert config["broker_transport"] == (TRANSPORT if switch == "on" else STOCK_TRANSPORT)
    options = config["broker_transport_options"]
    assert options["global_keyprefix"] == keys.BROKER_PREFIX == f"{keys.PREFIX}."


def test_a_rediss_url_gives_celery_its_tls_options() -> None:
    """Flower takes TLS from ``broker_use_ssl`` only (kombu's URL back out has no query)."""
    url = (
        "rediss://u:pw@cache:6380/0?ssl_ca_certs=/etc/ca.crt&ssl_certfile=/etc/c.crt"
        "&ssl_keyfile=/etc/c.key&ssl_password=nope&other=1"
    )
    assert broker_config(url, SETTINGS)["broker_use_ssl"] == {
        "ssl_ca_certs": "/etc/ca.crt",
        "ssl_certfile": "/etc/c.crt",
        "ssl_keyfile": "/etc/c.key",
        "ssl_cert_reqs": "required",
    }
    relaxed = broker_config("rediss://cache:6380/0?ssl_cert_reqs=none", SETTINGS)
    assert relaxed["broker_use_ssl"] == {"ssl_cert_reqs": "none"}
    assert "broker_use_ssl" not in broker_config("redis://cache:6379/0", SETTINGS)


def test_an_amqp_broker_gets_no_key_prefix() -> None:
    """``global_keyprefix`` is the Redis transport's option; AMQP has no keys."""
    options = broker_config("amqp://rabbit//", SETTINGS)["broker_transport_options"]
    assert "global_keyprefix" not in options
