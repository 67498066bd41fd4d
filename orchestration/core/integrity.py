"""Integrity tags of cache entries: an HMAC under the fleet key, bound to the entry's key. Pure.

Whoever can write the cache (the Redis of a cluster, the file of the embedded default)
could otherwise plant an answer or a whole run under a key Duet computes itself and have
it served. An entry is stored as ``t1:<tag>:<value>``, the tag an HMAC-SHA256 of the
entry's key and value under a key only the fleet's workers and submitters hold; an entry
without a valid tag is no entry (a miss, and the caller warns).
"""

from __future__ import annotations

import hashlib
import hmac

#: What a sealed entry starts with (the tag's version).
TAG_VERSION = "t1"
_TAG_CHARS = 64


def _tag(key: bytes, name: str, value: str) -> str:
    message = name.encode() + b"\x00" + value.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def seal(key: bytes, name: str, value: str) -> str:
    """``value`` as stored under ``name``, with its tag under ``key``."""
    return f"{TAG_VERSION}:{_tag(key, name, value)}:{value}"


def opened(key: bytes, name: str, stored: str) -> str | None:
    """The value sealed in ``stored`` under ``name``; ``None`` when its tag is missing or
    does not verify under ``key`` (written without the fleet key, or moved from another
    entry)."""
    version, _, rest = stored.partition(":")
    tag, sep, value = rest.partition(":")
    if version != TAG_VERSION or not sep or len(tag) != _TAG_CHARS:
        return None
    return value if hmac.compare_digest(tag, _tag(key, name, value)) else None


__all__ = ["TAG_VERSION", "opened", "seal"]
