"""The stand-in server's prompt cache: which prompt prefixes a caller has sent recently.

Vendors bill the part of a prompt that repeats a recent request's prefix at a lower
rate, and report it in the usage: OpenAI automatically (``prompt_tokens_details.
cached_tokens``), Anthropic where the request marks a ``cache_control`` breakpoint
(``cache_read_input_tokens``, and ``cache_creation_input_tokens`` for what it wrote).
This module reproduces both, per (API key, model), so tests and benchmarks can see
caching at work offline.

A prompt is a sequence of blocks — each tool definition, each system block, each message
content block, in the order the vendor reads them — and a prefix ends at a block
boundary. Its size is counted as the stand-in's model counts tokens: a quarter of its
characters. Rules, after the vendors' documentation:

- OpenAI: every request's prefixes of at least ``min_tokens`` are kept; a request reads
  its longest kept prefix, rounded down to ``min_tokens`` plus a multiple of 128.
- Anthropic: only prefixes ending at a ``cache_control`` block are written, when at least
  ``min_tokens`` long; a request reads the longest kept prefix ending at a breakpoint or
  up to 20 blocks before one, and writes from there to its last breakpoint.
- A kept prefix lasts ``ttl_s`` after its last use.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any

#: How many blocks before a breakpoint Anthropic looks back for a cached prefix.
LOOKBACK_BLOCKS = 20
#: OpenAI's cache hits grow in steps of this many tokens past the minimum.
OPENAI_STEP = 128


#: One block of a prompt: its text as hashed, whether it ends in a cache breakpoint, and
#: its size in characters as the stand-in's model counts them.
Block = tuple[str, bool, int]


def _part(role: Any, part: Any) -> Block:
    if isinstance(part, dict):
        text = part.get("text") or ""
        return json.dumps([role, text, part.get("input")]), "cache_control" in part, len(text)
    # A plain string is the same prompt text as a text block holding it.
    return json.dumps([role, str(part), None]), False, len(str(part))


def _tools(body: dict[str, Any]) -> list[Block]:
    return [
        (json.dumps(tool, sort_keys=True), "cache_control" in tool, len(json.dumps(tool)))
        for tool in body.get("tools") or []
        if isinstance(tool, dict)
    ]


def blocks(body: dict[str, Any], anthropic: bool) -> list[Block]:
    """A request's prompt as blocks, in the order the vendor reads them."""
    found = _tools(body)
    if anthropic:
        system = body.get("system")
        for block in [system] if isinstance(system, str) else system or []:
            found.append(_part("system", block))
    for message in body.get("messages") or []:
        content = message.get("content")
        if not anthropic and not isinstance(content, list):
            found.append(_part(message.get("role"), content or ""))
            continue
        for part in [content] if isinstance(content, str) else content or []:
            found.append(_part(message.get("role"), part))
    return found


class PromptCache:
    """Prefixes seen per (API key, model), with their expiry times. Thread-safe."""

    def __init__(self, min_tokens: int = 1024, ttl_s: float = 300.0) -> None:
        self.min_tokens = min_tokens
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._kept: dict[str, float] = {}  # prefix digest -> expiry (monotonic)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def _prefixes(
        self, key: str, model: str, body: dict[str, Any], anthropic: bool
    ) -> tuple[list[str], list[int], list[bool]]:
        """Digest and size in tokens of each prefix, and whether it ends at a breakpoint."""
        digest = hashlib.sha256(f"{key}\0{model}".encode())
        digests, tokens, marks = [], [], []
        chars = 0
        for text, mark, size in blocks(body, anthropic):
            digest.update(text.encode())
            digest.update(b"\0")
            digests.append(digest.copy().hexdigest())
            chars += size
            tokens.append(chars // 4)
            marks.append(mark)
        return digests, tokens, marks

    def _hit(self, digest: str, now: float) -> bool:
        expiry = self._kept.get(digest)
        if expiry is None or expiry <= now:
            self._kept.pop(digest, None)
            return False
        self._kept[digest] = now + self.ttl_s
        return True

    def openai(self, key: str, model: str, body: dict[str, Any]) -> int:
        """Cached tokens of this Chat Completions request; keeps its prefixes."""
        digests, tokens, _ = self._prefixes(key, model, body, anthropic=False)
        now = time.monotonic()
        read = 0
        with self._lock:
            for digest, size in zip(digests, tokens, strict=True):
                if size >= self.min_tokens and self._hit(digest, now):
                    read = size
            for digest, size in zip(digests, tokens, strict=True):
                if size >= self.min_tokens:
                    self._kept[digest] = now + self.ttl_s
        if read < self.min_tokens:
            return 0
        return self.min_tokens + (read - self.min_tokens) // OPENAI_STEP * OPENAI_STEP

    def anthropic(self, key: str, model: str, body: dict[str, Any]) -> tuple[int, int]:
        """``(cache read, cache write)`` tokens of this Messages request; keeps what it
        writes."""
        digests, tokens, marks = self._prefixes(key, model, body, anthropic=True)
        breakpoints = [i for i, mark in enumerate(marks) if mark]
        if not breakpoints:
            return 0, 0
        reachable = {i for b in breakpoints for i in range(max(0, b - LOOKBACK_BLOCKS + 1), b + 1)}
        now = time.monotonic()
        with self._lock:
            read_at = max((i for i in reachable if self._hit(digests[i], now)), default=-1)
            read = tokens[read_at] if read_at >= 0 else 0
            last = breakpoints[-1]
            if last <= read_at or tokens[last] < self.min_tokens:
                return read, 0
            for b in breakpoints:
                if b > read_at and tokens[b] >= self.min_tokens:
                    self._kept[digests[b]] = now + self.ttl_s
        return read, tokens[last] - read
