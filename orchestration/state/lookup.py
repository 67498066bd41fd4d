"""Ids from the prefixes people type: the batches and runs whose id starts with a text.

Batch ids are searched in the index of batches, run ids by a ``SCAN`` of run records; both
only on a text of id characters, so a typed prefix is never read as a glob pattern.
"""

from __future__ import annotations

import re
from typing import Any

from orchestration.state import keys

#: What a typed prefix may hold: the characters of Duet's ids (hex, the dashes of a UUID).
ID_PREFIX = re.compile(r"[0-9A-Za-z_-]{1,64}")
#: Keys a ``SCAN`` step examines; a few thousand keeps each step short on a busy server.
SCAN_COUNT = 5000


def batch_ids(client: Any) -> list[str]:
    """Every batch id in the index (newest first)."""
    return [_text(b) for b in client.zrevrange(keys.batches_index(), 0, -1)]


def batches_starting(client: Any, prefix: str, most: int = 10) -> list[str]:
    """Up to ``most`` batch ids that start with ``prefix`` (none for a text no id holds)."""
    if not ID_PREFIX.fullmatch(prefix):
        return []
    found = [b for b in batch_ids(client) if b.startswith(prefix)]
    return found[:most]


def runs_starting(client: Any, prefix: str, most: int = 10) -> list[str]:
    """Up to ``most`` run ids that start with ``prefix``, found by scanning run records."""
    if not ID_PREFIX.fullmatch(prefix):
        return []
    pattern = keys.run(prefix + "*")
    head, tail = pattern.split(prefix + "*", 1)
    found: list[str] = []
    for key in client.scan_iter(match=pattern, count=SCAN_COUNT):
        text = _text(key)
        if text.startswith(head) and text.endswith(tail):
            run_id = text[len(head) : len(text) - len(tail)]
            if run_id not in found:
                found.append(run_id)
        if len(found) >= most:
            break
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
