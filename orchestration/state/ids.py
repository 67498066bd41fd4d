"""Random ids a process makes for the fleet: task messages' ids, step claims, processes.

Read from the operating system (``uuid.uuid4``, ``secrets``). A generator of Duet's own
saved no measurable CPU (``bench.instructions``: within 1 % of a call), so it went.
"""

from __future__ import annotations

import secrets
import uuid


def random_hex(digits: int) -> str:
    """``digits`` random hexadecimal digits."""
    return secrets.token_hex((digits + 1) // 2)[:digits]


def uuid4_text() -> str:
    """The text of a random version-4 UUID (``str(uuid.uuid4())``)."""
    return str(uuid.uuid4())


__all__ = ["random_hex", "uuid4_text"]
