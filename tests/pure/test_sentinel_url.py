"""``sentinel://`` URLs as kombu spells them: parsed, written back where kombu reads the
login and database, shown without passwords, and given kombu's Sentinel transport."""

from __future__ import annotations

import pytest

from orchestration.core.errors import ConfigError
from orchestration.settings import Settings
from orchestration.state import connection, keys, preflight, sentinel
from orchestration.state.broker import SENTINEL_TRANSPORT, Connection, broker_config

URL = "sentinel://:s3cret@10.0.0.1:26379;sentinel://10.0.0.2;sentinel://10.0.0.3:26380/2"


def test_every_part_is_read() -> None:
    parsed = sentinel.parse(URL)
    assert parsed.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26380))
    assert (parsed.username, parsed.password, parsed.db) == (None, "s3cret", 2)


def test_the_canonical_url_has_the_login_first_and_the_database_everywhere() -> None:
    # kombu reads the password and database from the first part only.
    assert sentinel.parse(URL).canonical() == (
        "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://10.0.0.2:26379/2;"
        "sentinel://10.0.0.3:26380/2"
    )
    assert sentinel.parse("sentinel://h:1").canonical() == "sentinel://h:1/0"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h:1;redis://h:2/0", "part 2 of the Sentinel URL is not sentinel://HOST:PORT"),
        ("sentinel://h:1/a", "database 'a': it must be a number"),
        ("sentinel://h:1/1;sentinel://h:2/2", "names database 2, an earlier part 1"),
        ("sentinel://:a@h:1;sentinel://:b@h:2", "another password than an earlier part"),
        ("sentinel://h:99999", "cannot be read"),
    ],
)
def test_a_bad_url_is_one_line_without_its_password(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        sentinel.parse(url)
    assert says in str(err.value) and "DUET_REDIS_URL" in str(err.value)
    assert "\n" not in str(err.value) and ":b@" not in str(err.value)


def test_passwords_of_every_part_are_hidden() -> None:
    shown = connection.hide_password("sentinel://:one@h:1;sentinel://u:two@h:2/0")
    assert shown == "sentinel://:***@h:1;sentinel://u:***@h:2/0"


def test_the_scheme_passes_the_start_check() -> None:
    preflight.check_scheme(URL, "DUET_REDIS_URL")  # no Refused


def test_a_sentinel_broker_runs_kombus_sentinel_transport_on_duets_keys() -> None:
    config = broker_config(URL, Settings(redis_sentinel_master="queues"))
    options = config["broker_transport_options"]
    assert config["broker_transport"] == SENTINEL_TRANSPORT
    assert config["broker_url"] == sentinel.parse(URL).canonical()
    assert options["master_name"] == "queues"
    assert options["global_keyprefix"] == keys.BROKER_PREFIX
    assert "broker_use_ssl" not in config
    # Flower picks its Sentinel client by the scheme the connection writes back out.
    conn = Connection(config["broker_url"], transport=SENTINEL_TRANSPORT)
    assert conn.as_uri().startswith("sentinel://")
    assert "s3cret" not in conn.as_uri()


def test_a_redis_broker_gets_no_master_name() -> None:
    options = broker_config("redis://h:6379/0", Settings())["broker_transport_options"]
    assert "master_name" not in options


TLS_URL = (
    "sentinels://:s3cret@10.0.0.1:26379;sentinels://10.0.0.2/1"
    "?ssl_ca_certs=/etc/ca.crt&ssl_certfile=/etc/c.crt&ssl_keyfile=/etc/c.key"
)


def test_sentinels_means_tls_to_the_sentinels_and_the_primary() -> None:
    parsed = sentinel.parse("sentinels://h:1;sentinels://h:2/0")
    assert parsed.tls == {"ssl_cert_reqs": "required"}
    assert parsed.tls_kwargs() == {"ssl": True, "ssl_cert_reqs": "required"}
    assert sentinel.parse("sentinel://h:1/0").tls is None
    assert sentinel.parse("sentinel://h:1/0").tls_kwargs() == {}


def test_ssl_parameters_on_sentinel_mean_tls_too_read_from_any_part() -> None:
    """As redis-py and kombu spell them; given on the last part (after the database)."""
    parsed = sentinel.parse("sentinel://h:1;sentinel://h:2/0?ssl_ca_certs=/ca&ssl_cert_reqs=none")
    assert parsed.tls == {"ssl_ca_certs": "/ca", "ssl_cert_reqs": "none"}
    hostname = sentinel.parse("sentinels://h:1/0?ssl_check_hostname=false").tls_kwargs()
    assert hostname["ssl_check_hostname"] is False  # the string "false" would be true


def test_the_canonical_tls_url_is_kombus_scheme_with_the_tls_on_its_first_part() -> None:
    """kombu's Sentinel transport reads only ``sentinel://`` parts, and the login and TLS
    from the first; parsed again it says the same."""
    canonical = sentinel.parse(TLS_URL).canonical()
    assert canonical == (
        "sentinel://:s3cret@10.0.0.1:26379/1?ssl_ca_certs=%2Fetc%2Fca.crt&ssl_certfile="
        "%2Fetc%2Fc.crt&ssl_keyfile=%2Fetc%2Fc.key&ssl_cert_reqs=required;"
        "sentinel://10.0.0.2:26379/1"
    )
    assert sentinel.parse(canonical) == sentinel.parse(TLS_URL)
    assert connection.hide_password(canonical).startswith("sentinel://:***@10.0.0.1")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinels://h:1;sentinel://h:2/0", "TLS (sentinels://) is for every sentinel or none"),
        ("sentinel://h:1/0?ssl_ca_cert=/ca", "parameter 'ssl_ca_cert' is not one Duet reads"),
        ("sentinel://h:1/0?master_name=x", "parameter 'master_name' is not one"),
        ("sentinel://h:1/0?ssl_cert_reqs=maybe", "ssl_cert_reqs='maybe': use required"),
        ("sentinel://h:1/0?ssl_check_hostname=sure", "use true or false"),
        ("sentinel://h:1/0?ssl_ca_certs=", "ssl_ca_certs is empty"),
        (
            "sentinels://h:1?ssl_ca_certs=/a;sentinels://h:2/0?ssl_ca_certs=/b",
            "another ssl_ca_certs",
        ),
    ],
)
def test_a_bad_tls_url_is_one_line(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        sentinel.parse(url, "DUET_BROKER_URL")
    assert says in str(err.value) and "DUET_BROKER_URL" in str(err.value), str(err.value)


def test_a_tls_sentinel_broker_asks_the_sentinels_and_the_primary_over_tls() -> None:
    """kombu's Sentinel transport: the primary's TLS from ``broker_use_ssl`` (Celery's
    ``ssl``), the sentinels' from ``sentinel_kwargs``; Flower reads both from there."""
    settings = Settings(redis_socket_timeout_s=9, redis_connect_timeout_s=3)
    config = broker_config(TLS_URL, settings)
    files = {
        "ssl_ca_certs": "/etc/ca.crt",
        "ssl_certfile": "/etc/c.crt",
        "ssl_keyfile": "/etc/c.key",
    }
    assert config["broker_transport"] == SENTINEL_TRANSPORT
    assert config["broker_url"].startswith("sentinel://:s3cret@10.0.0.1:26379/1?")
    assert config["broker_use_ssl"] == {**files, "ssl_cert_reqs": "required"}
    assert config["broker_transport_options"]["sentinel_kwargs"] == {
        "ssl": True,
        **files,
        "ssl_cert_reqs": "required",
        "socket_timeout": 9,
        "socket_connect_timeout": 3,
    }
    plain = broker_config(URL, settings)["broker_transport_options"]["sentinel_kwargs"]
    assert plain == {"socket_timeout": 9, "socket_connect_timeout": 3}


def test_a_tls_sentinel_client_makes_tls_connections_to_both() -> None:
    """Nothing connects until asked: the connection classes say what would."""
    from redis.connection import SSLConnection
    from redis.sentinel import SentinelManagedSSLConnection

    client = sentinel.master_client(TLS_URL, "mymaster", socket_timeout=2)
    pool = client.connection_pool
    assert issubclass(pool.connection_class, SentinelManagedSSLConnection)
    assert pool.connection_kwargs["ssl_ca_certs"] == "/etc/ca.crt"
    assert pool.connection_kwargs["db"] == 1 and pool.connection_kwargs["password"] == "s3cret"
    for asked in pool.sentinel_manager.sentinels:
        kwargs = asked.connection_pool.connection_kwargs
        assert asked.connection_pool.connection_class is SSLConnection
        assert kwargs["ssl_certfile"] == "/etc/c.crt" and kwargs["socket_timeout"] == 2
        assert kwargs["password"] is None  # the sentinels' own is DUET_REDIS_SENTINEL_PASSWORD


def test_a_tls_scheme_passes_the_start_check_only_with_its_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    preflight.check_scheme(f"sentinels://h:1/0?ssl_ca_certs={ca}", "DUET_REDIS_URL")
    with pytest.raises(
        preflight.Refused, match=r"DUET_REDIS_URL: ssl_ca_certs=.*gone.* is not there"
    ):
        preflight.check_scheme(f"sentinels://h:1/0?ssl_ca_certs={tmp_path}/gone", "DUET_REDIS_URL")
    with pytest.raises(preflight.Refused, match="is not there"):
        preflight.check_scheme(f"rediss://h:1/0?ssl_certfile={tmp_path}/gone", "DUET_REDIS_URL")


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (
            "No master found for 'm' : Redis<ConnectionPool<Connection<host=h,port=1,db=0>>> - "
            "Error 1 connecting to h:1. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
            "failed: self-signed certificate in certificate chain (_ssl.c:1006)., Redis<...>",
            "the TLS handshake with the sentinels failed: [SSL: CERTIFICATE_VERIFY_FAILED] "
            "certificate verify failed: self-signed certificate in certificate chain",
        ),
        ("No master found for 'm'", "none watches a primary named 'm'"),
        (
            "No master found for 'm' : Redis<...> - Connection closed by server.",
            "all down or unreachable (sentinels that take TLS only are named sentinels://)",
        ),
    ],
)
def test_why_no_primary_names_the_cause(message: str, says: str) -> None:
    assert says in sentinel.why_no_primary(message, "m")


def test_a_tls_failure_is_a_setting_to_fix() -> None:
    import redis

    url = "sentinels://h:1/0"
    failed = redis.exceptions.ConnectionError(
        "Error 1 connecting to h:1. [SSL: WRONG_VERSION_NUMBER] x"
    )
    assert isinstance(
        connection.refused_login(url, "DUET_REDIS_URL", failed), connection.TlsRefused
    )
    lost = redis.exceptions.ConnectionError("Connection closed by server.")
    assert connection.refused_login(url, "DUET_REDIS_URL", lost) is None
