"""The model-call cache's pure part: the key of a call, the TTL syntax, the stored entry.

A key is the sha256 of canonical JSON of everything that determines the answer: provider,
the whole base URL (scheme, host, port and path: two servers behind one host are two
servers), model, the full message list (system prompt included), every generation
setting, the structured-output schema, the API version and the API key variable's *name*
(so one tenant's answer is never served under another's key). Exact: any change misses.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.completion import UNFINISHED, Completion, Message
from orchestration.core.errors import ConfigError
from orchestration.core.tools import ToolCall

#: Bumped when what a key covers or what an entry holds changes (old entries then miss).
KEY_VERSION = 2
#: Default time to live of an entry (Inspect AI's default too): a week.
DEFAULT_TTL_S = 7 * 24 * 3600.0
#: Default cap on entries; the least recently used go first past it.
DEFAULT_MAX_ENTRIES = 100_000

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_ttl(text: str | float | int, where: str = "cache ttl") -> float:
    """Seconds in ``text`` (``90``, ``30m``, ``12h``, ``7d``, ``2w``).

    Raises:
        ConfigError: not a positive duration, naming ``where``.
    """
    if isinstance(text, bool):
        raise ConfigError(f"{where}: expected a duration such as '7d', not {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _TTL.match(str(text))
        if match is None:
            raise ConfigError(
                f"{where}: {text!r} is not a duration; use a number with s, m, h, d or w "
                "(e.g. '7d', '12h')"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ConfigError(f"{where}: the duration must be above 0, not {text!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """What determines a model's answer to one call, apart from the messages."""

    provider: str
    base_url: str | None
    model: str
    instructions: str
    settings: dict[str, Any]
    #: The structured-output schema asked for; None when the call asks for none.
    schema: dict[str, Any] | None
    #: SDK / API version the call goes through (``openai==1.2.3``, ``anthropic-version``).
    api_version: str
    #: The name (never the value) of the variable holding the key.
    key_env: str | None


def endpoint_of(base_url: str | None) -> str | None:
    """``base_url`` as a cache key holds it: whole (scheme, credentials' variable names,
    host, port, path, query), scheme and host in lower case, a trailing ``/`` dropped."""
    if base_url is None:
        return None
    parts = urlsplit(base_url)
    user, at, host = parts.netloc.rpartition("@")
    netloc = f"{user}{at}{host.lower()}"
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme.lower(), netloc, path, parts.query, ""))


def call_key(identity: CallIdentity, messages: list[Message]) -> str:
    """The cache key of a call: hex sha256 of canonical JSON of ``identity`` (its whole
    base URL, :func:`endpoint_of`) and ``messages``."""
    doc = {
        "v": KEY_VERSION,
        **asdict(identity),
        "base_url": endpoint_of(identity.base_url),
        "messages": [_keyed(m) for m in messages],
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _keyed(message: Message) -> dict[str, Any]:
    """What of a message makes the key: role and content, and a turn's tool calls or the
    call a tool result answers (a rerun with the same tool results is a hit)."""
    keyed: dict[str, Any] = {"role": message["role"], "content": message["content"]}
    for extra in ("tool_calls", "tool_call_id", "is_error"):
        if extra in message:
            keyed[extra] = message[extra]
    return keyed


def storable(completion: Completion) -> bool:
    """Whether an answer may be cached: a whole one (never a refusal or a reply cut)."""
    return completion.stop_reason not in UNFINISHED


def entry_json(completion: Completion) -> str:
    """The stored form of an answer."""
    return json.dumps(asdict(completion), separators=(",", ":"), ensure_ascii=False)


def entry_from(text: str | bytes) -> Completion | None:
    """The answer stored as ``text``; None when it is not one (a damaged or old entry)."""
    try:
        data = json.loads(text)
        data["tool_calls"] = tuple(ToolCall(**c) for c in data.get("tool_calls") or ())
        completion = Completion(**data)
    except (ValueError, TypeError):
        return None
    if not isinstance(completion.text, str) or not storable(completion):
        return None
    return completion


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What ``duet cache stats`` shows of a store."""

    backend: str
    where: str
    entries: int
    bytes: int
    hits: int
    misses: int
    #: Unix time of the least recently used entry; None when empty.
    oldest: float | None


__all__ = [
    "CacheSpec",
    "cache_spec",
    "CacheStats",
    "CallIdentity",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_TTL_S",
    "call_key",
    "entry_from",
    "entry_json",
    "parse_ttl",
    "storable",
]


class CacheSpec(BaseModel):
    """A loop's cache settings: answers up to ``ttl_s`` old are served; the store keeps at
    most ``max_entries`` entries and ``max_mb`` MB of answers (least recently used go)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttl_s: float = Field(default=DEFAULT_TTL_S, gt=0)
    max_entries: int = Field(default=DEFAULT_MAX_ENTRIES, ge=1)
    max_mb: float = Field(default=512.0, gt=0)

    @property
    def max_bytes(self) -> int:
        """``max_mb`` in bytes, as the stores take it."""
        return int(self.max_mb * 1024 * 1024)


def cache_spec(value: CacheSpec | bool | str | float | None) -> CacheSpec | None:
    """``Team.actor_critic(cache=...)`` as a :class:`CacheSpec`: True (the defaults), a TTL
    (``"7d"``, seconds), a spec, or False / None (off)."""
    if value is None or value is False:
        return None
    if value is True:
        return CacheSpec()
    if isinstance(value, CacheSpec):
        return value
    return CacheSpec(ttl_s=parse_ttl(value, "cache"))
