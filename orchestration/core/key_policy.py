"""Which key variables a worker sends, and to which hosts: the operator's allowlist. Pure.

A spec names the environment variable holding its key (``api_key_env``) and those holding
its ``base_url``'s credentials (``USER:${VARIABLE}@host``). Whoever can submit a spec
chooses those names, so a worker sends a variable only when its operator put it on the
worker's allowlist, and only to a host allowed for it: the vendors' keys to the vendors'
API hosts by default (:data:`DEFAULT_KEY_HOSTS`), plus what ``DUET_KEY_HOSTS`` adds
(:func:`parse_key_hosts`). Anything else is refused, naming the variable, at submit (the
client checks the policies the live workers publish) and again at the worker.

A host rule is ``host``, ``host:port`` or ``scheme://host[:port]``; without a scheme it
allows ``https`` only (a key never crosses plain HTTP unless the operator wrote ``http://``).
An agent with no ``base_url`` calls its vendor (or the ``OPENAI_BASE_URL`` /
``ANTHROPIC_BASE_URL`` its worker's operator set): its host is the vendor's API host.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from orchestration.core import url_credentials
from orchestration.core.agents import DEFAULT_KEY_ENV, VENDOR_HOSTS, AgentSpec

#: The variables every worker may send, and where: each vendor's key to its API hosts.
DEFAULT_KEY_HOSTS: Mapping[str, tuple[str, ...]] = {
    variable: tuple(sorted(VENDOR_HOSTS[provider]))
    for provider, variable in DEFAULT_KEY_ENV.items()
    if variable is not None
}
#: The operator setting that adds variables and hosts (named in every refusal).
SETTING = "DUET_KEY_HOSTS"
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RULE = re.compile(r"(?:(?P<scheme>https?)://)?(?P<host>[^\s/:@]+)(?::(?P<port>\d{1,5}))?/?")


@dataclass(frozen=True, order=True)
class HostRule:
    """One place a variable may be sent: a scheme, a host and, optionally, one port."""

    scheme: str
    host: str
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostRule:
        """``host``, ``host:port`` or ``http(s)://host[:port]`` (``https`` when unsaid).

        Raises:
            ValueError: any other shape, quoted in the message (it holds no secret).
        """
        found = _RULE.fullmatch(text.strip())
        if found is None or (found["port"] and not 0 < int(found["port"]) < 65536):
            raise ValueError(f"host rule {text!r} is not host, host:port or http(s)://host[:port]")
        port = int(found["port"]) if found["port"] else None
        return cls(found["scheme"] or "https", found["host"].lower(), port)

    def allows(self, scheme: str, host: str, port: int | None) -> bool:
        """Whether a request to ``scheme://host:port`` is one this rule allows."""
        return (
            scheme == self.scheme and host == self.host and (self.port is None or self.port == port)
        )

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}" + (f":{self.port}" if self.port else "")


def parse_key_hosts(text: str) -> dict[str, list[str]]:
    """``DUET_KEY_HOSTS`` as written: JSON (``{"TEAM_B_API_KEY": ["gw.b.example"]}``) or
    ``NAME=host,host;NAME=host``. Each host is checked (:meth:`HostRule.parse`).

    Raises:
        ValueError: a bad variable name or host rule, naming it.
    """
    text = text.strip()
    if not text:
        return {}
    parsed: object
    if text.startswith("{"):
        parsed = json.loads(text)
    else:
        table: dict[str, list[str]] = {}
        for part in filter(None, (p.strip() for p in text.split(";"))):
            name, eq, hosts = part.partition("=")
            if not eq:
                raise ValueError(f"{SETTING}: {part!r} is not NAME=host[,host...]")
            table[name.strip()] = [h.strip() for h in hosts.split(",") if h.strip()]
        parsed = table
    return checked_key_hosts(parsed)


def checked_key_hosts(value: object) -> dict[str, list[str]]:
    """``value`` when it maps variable names to lists of host rules (each parsed once).

    Raises:
        ValueError: naming the bad name or rule.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"{SETTING}: a map of variable name to hosts")
    result: dict[str, list[str]] = {}
    for name, hosts in value.items():
        if not isinstance(name, str) or not _VARIABLE.fullmatch(name):
            raise ValueError(f"{SETTING}: {name!r} is not an environment variable name")
        if isinstance(hosts, str) or not isinstance(hosts, Sequence):
            raise ValueError(f"{SETTING}: the hosts of {name} are a list")
        result[name] = [str(HostRule.parse(str(h))) for h in hosts]
    return result


@dataclass(frozen=True)
class KeyPolicy:
    """The variables a worker sends and the hosts each may go to."""

    #: Variable name -> the rules of the hosts it may be sent to.
    hosts: Mapping[str, frozenset[HostRule]]

    @classmethod
    def with_extra(cls, extra: Mapping[str, Sequence[str]] | None = None) -> KeyPolicy:
        """The defaults (:data:`DEFAULT_KEY_HOSTS`) plus ``extra`` (variable -> hosts)."""
        merged: dict[str, set[HostRule]] = {}
        for source in (DEFAULT_KEY_HOSTS, extra or {}):
            for name, rules in source.items():
                merged.setdefault(name, set()).update(HostRule.parse(r) for r in rules)
        return cls({name: frozenset(rules) for name, rules in merged.items()})

    def to_json(self) -> str:
        """The policy as JSON, the same text for the same policy (what workers publish)."""
        table = {n: sorted(str(r) for r in rules) for n, rules in sorted(self.hosts.items())}
        return json.dumps(table, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> KeyPolicy:
        """A policy :meth:`to_json` wrote (``ValueError`` if it is none)."""
        return cls.with_extra(checked_key_hosts(json.loads(text)))

    def problem(self, variable: str, url: str) -> str | None:
        """Why ``variable`` may not be sent to ``url``, else ``None``."""
        rules = self.hosts.get(variable)
        if rules is None:
            return (
                f"key variable {variable} is not on the workers' allowlist: they send only "
                f"{', '.join(sorted(self.hosts))} (an operator adds others with {SETTING} "
                "on the workers)"
            )
        parts = urlsplit(url)
        scheme, host = parts.scheme, (parts.hostname or "").lower()
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
        if any(rule.allows(scheme, host, port) for rule in rules):
            return None
        return (
            f"key variable {variable} may not be sent to {scheme}://{host}:{port}: the "
            f"workers send it only to {', '.join(sorted(map(str, rules)))} (add the host "
            f"with {SETTING} on the workers to allow it)"
        )

    def agent_problem(self, agent: AgentSpec) -> str | None:
        """Why a worker may not make ``agent``'s calls with the variables it names (the
        first refusal), else ``None``."""
        if agent.provider not in VENDOR_HOSTS:
            return None  # the offline simulator sends nothing anywhere
        target = destination(agent)
        for variable in sent_variables(agent):
            found = self.problem(variable, target)
            if found is not None:
                return found
        return None


def sent_variables(agent: AgentSpec) -> Iterator[str]:
    """The environment variables whose values ``agent``'s calls carry."""
    if agent.api_key_env:
        yield agent.api_key_env
    yield from url_credentials.variables(agent.base_url)


def destination(agent: AgentSpec) -> str:
    """Where ``agent``'s calls go: its ``base_url`` without credentials, else its vendor's
    API host."""
    if agent.base_url is not None:
        return url_credentials.without_credentials(agent.base_url)
    return f"https://{min(VENDOR_HOSTS[agent.provider])}"


__all__ = [
    "DEFAULT_KEY_HOSTS",
    "HostRule",
    "KeyPolicy",
    "checked_key_hosts",
    "destination",
    "parse_key_hosts",
    "sent_variables",
]
