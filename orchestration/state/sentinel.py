"""Sentinel URLs, spelled as kombu spells them, and clients of the primary they name.

``sentinel://[:PASSWORD@]HOST:PORT[;sentinel://HOST:PORT...]/DB[?ssl_...]``: the sentinels
to ask, the primary's password and database; the primary's name is
``DUET_REDIS_SENTINEL_MASTER``. ``sentinels://``, or any of redis-py's ``ssl_*`` query
parameters, means TLS to the sentinels and to the primary alike. A client from
:func:`master_client` uses redis-py's ``SentinelConnectionPool``, which asks the sentinels
for the primary on every new connection, so after a failover it follows the new one (a
connection to the old one fails, an outage the caller retries).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from orchestration.core.errors import ConfigError
from orchestration.state import tlsquery

SCHEME = "sentinel"
#: The same over TLS (to the sentinels and the primary).
TLS_SCHEME = "sentinels"
#: Sentinel's own port, for a part that names none.
DEFAULT_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """What a Sentinel URL says: the sentinels, the primary's login and database, and
    TLS (redis-py's ``ssl_*`` arguments; None: no TLS)."""

    sentinels: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int
    tls: dict[str, str] | None = None

    def canonical(self) -> str:
        """The URL as kombu reads it: ``sentinel://`` parts (the only scheme its Sentinel
        transport takes), the login and the TLS arguments on the first part (where kombu
        reads them), the database on every part (so each client agrees on it)."""
        login = ""
        if self.password is not None:
            login = f"{self.username or ''}:{self.password}@"
        query = f"?{urlencode(self.tls)}" if self.tls is not None else ""
        parts = [
            f"{SCHEME}://{login if n == 0 else ''}{host}:{port}/{self.db}{query if n == 0 else ''}"
            for n, (host, port) in enumerate(self.sentinels)
        ]
        return ";".join(parts)

    def tls_kwargs(self) -> dict[str, Any]:
        """redis-py's arguments for a TLS connection (to a sentinel or the primary);
        empty without TLS."""
        if self.tls is None:
            return {}
        return {"ssl": True, **tlsquery.client_kwargs(self.tls)}


def is_sentinel(url: object) -> bool:
    """Whether ``url`` is a Sentinel URL (``sentinel://`` or ``sentinels://``)."""
    return isinstance(url, str) and url.startswith((f"{SCHEME}://", f"{TLS_SCHEME}://"))


def parse(url: str, variable: str = "DUET_REDIS_URL") -> SentinelURL:
    """The parts of a Sentinel URL (pure).

    Raises:
        ConfigError: a part that is not ``sentinel://HOST[:PORT]`` (or ``sentinels://``,
            the same on every part), a database that is not a number, a query parameter
            that is not one of redis-py's TLS arguments, or parts that name different
            databases, passwords or TLS arguments (one line, the variable named, no
            password shown).
    """
    sentinels: list[tuple[str, int]] = []
    username = password = None
    db: int | None = None
    schemes: set[str] = set()
    tls: dict[str, str] = {}
    for n, part in enumerate(url.split(";"), 1):
        where = f"{variable}: part {n} of the Sentinel URL"
        try:
            parts = urlsplit(part)
            host, port = parts.hostname, parts.port or DEFAULT_PORT
        except ValueError as exc:
            raise ConfigError(f"{where} cannot be read: {exc}") from None
        if parts.scheme not in (SCHEME, TLS_SCHEME) or not host:
            raise ConfigError(f"{where} is not sentinel://HOST:PORT (or sentinels://)")
        schemes.add(parts.scheme)
        if len(schemes) > 1:
            raise ConfigError(
                f"{where} is {parts.scheme}://, an earlier part not: TLS (sentinels://) "
                "is for every sentinel or none"
            )
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            why = tlsquery.problem(name, value)
            if why is not None:
                raise ConfigError(f"{where}: {why}")
            if tls.get(name, value) != value:
                raise ConfigError(f"{where} gives another {name} than an earlier part")
            tls[name] = value
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
    wants_tls = bool(tls) or TLS_SCHEME in schemes
    if wants_tls:
        tls.setdefault("ssl_cert_reqs", "required")
    ordered = {name: tls[name] for name in tlsquery.TLS_QUERY if name in tls}
    return SentinelURL(
        tuple(sentinels), username, password, db or 0, ordered if wants_tls else None
    )


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


def sentinel_kwargs(parsed: SentinelURL, **socket: Any) -> dict[str, Any]:
    """redis-py's arguments for the connections to the sentinels (kombu's and Flower's
    ``sentinel_kwargs``): the ``socket`` options given, their password
    (:func:`sentinel_login`) and TLS, as the URL says."""
    return {**socket, **sentinel_login(), **parsed.tls_kwargs()}


#: Words in an error that say TLS failed (a certificate, a protocol mismatch).
TLS_WORDS = ("ssl", "tls", "certificate")


def why_no_primary(message: str, master: str, tls: bool = False) -> str:
    """The cause of redis-py's ``MasterNotFoundError`` (its ``message`` lists each
    sentinel's error), in words: the password refused, TLS, none answering, or none
    watching ``master``; ``tls``: whether the sentinels were asked over TLS."""
    text = message.lower()
    if any(w in text for w in ("authentication", "wrongpass", "noauth", "invalid password")):
        return (
            "the sentinels refused the password (set DUET_REDIS_SENTINEL_PASSWORD to the "
            "sentinels' requirepass; the URL's password is the primary's)"
        )
    if any(w in text for w in TLS_WORDS):
        return f"the TLS handshake with the sentinels failed: {_tls_error(message)}"
    if " : " not in message:  # every sentinel answered; none named it
        return (
            f"the sentinels answered, but none watches a primary named {master!r} "
            "(DUET_REDIS_SENTINEL_MASTER)"
        )
    hint = "" if tls else " (sentinels that take TLS only are named sentinels://)"
    return (
        f"no sentinel answered about a primary named {master!r} "
        f"(DUET_REDIS_SENTINEL_MASTER): all down or unreachable{hint}"
    )


def _tls_error(message: str) -> str:
    """The first TLS error in ``message`` (``[SSL: ...] ...``), without redis-py's wrapping
    and the other sentinels' reprs."""
    found = _SSL_ERROR.search(message)
    return (found.group(1) if found else message).strip(" .,")[:160]


_SSL_ERROR = re.compile(r"(\[SSL[^\]]*\][^(<]*)")


def master_client(url: str, master: str, **kwargs: Any) -> Any:
    """A ``redis.Redis`` of the primary Sentinel names ``master``: ``kwargs`` are its
    connection's (and pool's); the sentinels are asked with the same socket timeouts
    (:func:`sentinel_kwargs`); TLS to both when the URL says so."""
    from redis.sentinel import Sentinel

    parsed = parse(url)
    socket = {k: v for k, v in kwargs.items() if k.startswith("socket_") or k == "retry"}
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_kwargs(parsed, **socket))
    return sentinel.master_for(
        master,
        username=parsed.username,
        password=parsed.password,
        db=parsed.db,
        **parsed.tls_kwargs(),
        **kwargs,
    )
