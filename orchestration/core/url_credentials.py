"""Credentials in a ``base_url``: a worker environment variable's name, never a value. Pure.

A gateway or proxy that wants basic auth in its URL gets it as
``https://USER:${VARIABLE}@host/v1`` (the user name may be written out or be a
``${VARIABLE}`` too; ``https://${VARIABLE}@host`` sends a token as the user name). The
spec, stored in Redis and hashed into the spec id, keeps the URL so written; the worker
reads each variable from its own environment when it builds the client
(:func:`credentials`) and treats it as it treats an ``api_key_env`` variable: a secret.
A password written out, or a user name alone (it may be a token), is refused.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

#: A reference to a worker environment variable: ``${NAME}``.
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: The variable name the fix in an error message suggests.
_EXAMPLE_VARIABLE = "GATEWAY_PASSWORD"


class MissingVariable(LookupError):
    """A variable a URL names is not set (``name``: the variable, never a value)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(frozen=True, repr=False)
class BasicCredentials:
    """A user and password for HTTP basic auth, read from the environment (not printed)."""

    user: str
    password: str

    def header(self) -> str:
        """The ``Authorization`` header value."""
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")
        return f"Basic {token}"


def _userinfo(url: str) -> tuple[str | None, str]:
    """``url``'s ``user:password`` part (``None`` without one) and its ``host:port``."""
    netloc = urlsplit(url).netloc
    userinfo, at, host = netloc.rpartition("@")
    return (userinfo if at else None), host


def _whole_reference(part: str) -> str | None:
    """The variable ``part`` names when it is exactly one ``${NAME}``."""
    found = REFERENCE.fullmatch(part)
    return found[1] if found else None


def problem(url: str) -> str | None:
    """Why ``url`` cannot be stored with a spec (a credential written in it), else ``None``.

    Never quotes a password or a lone user name; the fix it suggests keeps a written-out
    user name and the URL's host and path."""
    shape = _shape_problem(url)
    if shape is not None:
        return shape
    userinfo, host = _userinfo(url)
    rest = url if userinfo is None else url.replace(f"{userinfo}@", "", 1)
    if "${" in rest:
        return (
            "a ${VARIABLE} is only read in the URL's user:password@ part (basic auth for a "
            "gateway); anywhere else it would be sent as written"
        )
    if userinfo is None:
        return None
    user, _, password = userinfo.partition(":")
    named_user = _whole_reference(user) is not None
    if "${" in user and not named_user:
        return "credentials in the URL: the user name is written out, or is one ${VARIABLE}"
    if password and _whole_reference(password) is None:
        fix = _fixed(url, f"{user or 'USER'}:${{{_EXAMPLE_VARIABLE}}}", host)
        return (
            "credentials in the URL: a password written in it would be stored with the spec "
            "in Redis; put it in an environment variable of the workers and name that "
            f"instead, as {fix}"
        )
    if not password and not named_user:
        return (
            "credentials in the URL: a user name without a ${VARIABLE} password would be "
            "stored with the spec in Redis (it may be a token); write "
            f"{_fixed(url, f'USER:${{{_EXAMPLE_VARIABLE}}}', host)}, or "
            f"{_fixed(url, '${GATEWAY_TOKEN}', host)} for a token, with the variable set on "
            "the workers"
        )
    return None


def _shape_problem(url: str) -> str | None:
    """Why ``url`` hides credentials past its host (``user:pa/ss@host``: the ``/`` ends the
    host, so the password would be read as a port and kept in the path) or has a port no
    client takes; never quotes the URL."""
    authority_and_rest = url.partition("://")[2]
    authority = re.split(r"[/?#]", authority_and_rest, maxsplit=1)[0]
    if "@" in authority_and_rest[len(authority) :]:
        return (
            "credentials in the URL: an '@' after the host (a password holding '/', '?' or "
            "'#' ends the host early and would be stored with the spec in Redis); put it in "
            "an environment variable of the workers and write USER:${VARIABLE}@host"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not 0-65535
    except ValueError:
        return "not a URL with a valid host and port"
    return None


def _fixed(url: str, userinfo: str, host: str) -> str:
    """``url``'s scheme, host and path with ``userinfo`` (the fix an error suggests)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, f"{userinfo}@{host}", parts.path, "", ""))


def checked(url: str | None) -> str | None:
    """``url`` when :func:`problem` finds nothing (raises ``ValueError`` with the problem:
    the field validators of specs)."""
    if url is not None:
        found = problem(url)
        if found is not None:
            raise ValueError(found)
    return url


def variables(url: str | None) -> tuple[str, ...]:
    """The environment variables ``url``'s credentials name, in order."""
    if url is None:
        return ()
    userinfo, _ = _userinfo(url)
    return tuple(REFERENCE.findall(userinfo)) if userinfo else ()


def has_credentials(url: str | None) -> bool:
    """Whether ``url`` carries a ``user[:password]@`` part."""
    return url is not None and _userinfo(url)[0] is not None


def without_credentials(url: str) -> str:
    """``url`` without its ``user:password@`` part: where the client sends its calls."""
    userinfo, host = _userinfo(url)
    if userinfo is None:
        return url
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def credentials(url: str | None, environ: Mapping[str, str]) -> BasicCredentials | None:
    """The basic-auth credentials ``url`` names, each ``${VARIABLE}`` read from
    ``environ`` (a written-out user name percent-decoded); ``None`` without any.

    Raises:
        MissingVariable: a variable it names is not set (or empty) in ``environ``.
    """
    if url is None:
        return None
    userinfo, _ = _userinfo(url)
    if userinfo is None:
        return None
    user, _, password = userinfo.partition(":")
    return BasicCredentials(_value(user, environ), _value(password, environ))


def _value(part: str, environ: Mapping[str, str]) -> str:
    name = _whole_reference(part)
    if name is None:
        return unquote(part)
    value = environ.get(name)
    if not value:
        raise MissingVariable(name)
    return value
