"""Sentinel URLs, spelled as kombu spells them, and clients of the primary they name.

``sentinel://[:PASSWORD@]HOST:PORT[;sentinel://HOST:PORT...]/DB``: the sentinels to ask,
the primary's password and database; the primary's name is ``DUET_REDIS_SENTINEL_MASTER``.
A client from :func:`master_client` uses redis-py's ``SentinelConnectionPool``, which asks
the sentinels for the primary on every new connection, so after a failover it follows the
new one (a connection to the old one fails, an outage the caller retries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from orchestration.core.errors import ConfigError

SCHEME = "sentinel"
#: Sentinel's own port, for a part that names none.
DEFAULT_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """What a ``sentinel://`` URL says: the sentinels, and the primary's login and database."""

    sentinels: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int

    def canonical(self) -> str:
        """The URL with the login and database on its first part (where kombu reads them)
        and the database on every part (so each client agrees on it)."""
        login = ""
        if self.password is not None:
            login = f"{self.username or ''}:{self.password}@"
        parts = [
            f"{SCHEME}://{login if n == 0 else ''}{host}:{port}/{self.db}"
            for n, (host, port) in enumerate(self.sentinels)
        ]
        return ";".join(parts)


def is_sentinel(url: object) -> bool:
    """Whether ``url`` is a ``sentinel://`` URL."""
    return isinstance(url, str) and url.startswith(f"{SCHEME}://")


def parse(url: str, variable: str = "DUET_REDIS_URL") -> SentinelURL:
    """The parts of a ``sentinel://`` URL (pure).

    Raises:
        ConfigError: a part that is not ``sentinel://HOST[:PORT]``, a database that is not a
            number, or parts that name different databases or passwords (one line, the
            variable named, no password shown).
    """
    sentinels: list[tuple[str, int]] = []
    username = password = None
    db: int | None = None
    for n, part in enumerate(url.split(";"), 1):
        where = f"{variable}: part {n} of the Sentinel URL"
        try:
            parts = urlsplit(part)
            host, port = parts.hostname, parts.port or DEFAULT_PORT
        except ValueError as exc:
            raise ConfigError(f"{where} cannot be read: {exc}") from None
        if parts.scheme != SCHEME or not host:
            raise ConfigError(f"{where} is not sentinel://HOST:PORT")
        if parts.password is not None:
            if password is not None and unquote(parts.password) != password:
                raise ConfigError(f"{where} gives another password than an earlier part")
            username, password = unquote(parts.username or "") or None, unquote(parts.password)
        path = parts.path.strip("/")
        if path:
            if not path.isdigit():
                raise ConfigError(f"{where} has database {path!r}: it must be a number")
            if db is not None and int(path) != db:
                raise ConfigError(f"{where} names database {path}, an earlier part {db}")
            db = int(path)
        sentinels.append((host, port))
    return SentinelURL(tuple(sentinels), username, password, db or 0)


def hide_password(url: str) -> str:
    """``url`` with the password of each part replaced by ``***`` (an unreadable one: not
    shown at all)."""
    shown = []
    for part in url.split(";"):
        try:
            parts = urlsplit(part)
            netloc = parts.netloc
            if parts.password is not None:
                netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
            shown.append(parts._replace(netloc=netloc).geturl())
        except ValueError:
            return "<unparseable URL>"
    return ";".join(shown)


def sentinel_login() -> dict[str, str]:
    """How the sentinels are asked: with ``DUET_REDIS_SENTINEL_PASSWORD`` when it is set
    (managed sentinels with a ``requirepass``), else without a password."""
    from orchestration.settings import get_settings

    secret = get_settings().redis_sentinel_password
    return {"password": secret.get_secret_value()} if secret is not None else {}


def why_no_primary(message: str, master: str) -> str:
    """The cause of redis-py's ``MasterNotFoundError`` (its ``message`` lists each
    sentinel's error), in words: the password refused, TLS, none answering, or none
    watching ``master``."""
    text = message.lower()
    if any(w in text for w in ("authentication", "wrongpass", "noauth", "invalid password")):
        return (
            "the sentinels refused the password (set DUET_REDIS_SENTINEL_PASSWORD to the "
            "sentinels' requirepass; the URL's password is the primary's)"
        )
    if "ssl" in text or "tls" in text or "certificate" in text:
        return f"TLS with the sentinels failed: {message[:200]}"
    if " : " not in message:  # every sentinel answered; none named it
        return (
            f"the sentinels answered, but none watches a primary named {master!r} "
            "(DUET_REDIS_SENTINEL_MASTER)"
        )
    return (
        f"no sentinel answered about a primary named {master!r} "
        "(DUET_REDIS_SENTINEL_MASTER): all down or unreachable"
    )


def master_client(url: str, master: str, **kwargs: Any) -> Any:
    """A ``redis.Redis`` of the primary Sentinel names ``master``: ``kwargs`` are its
    connection's (and pool's); the sentinels are asked with the same socket timeouts and
    no password (as kombu and Flower ask them)."""
    from redis.sentinel import Sentinel

    parsed = parse(url)
    asking = {k: v for k, v in kwargs.items() if k.startswith("socket_") or k == "retry"}
    asking.update(sentinel_login())
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=asking)
    return sentinel.master_for(
        master, username=parsed.username, password=parsed.password, db=parsed.db, **kwargs
    )
