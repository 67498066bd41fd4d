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
