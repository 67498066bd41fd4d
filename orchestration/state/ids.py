"""Random ids a process makes for the fleet: task messages' ids, step claims, processes.

Each is unique across every process of the fleet the way a version-4 UUID is (122 or more
random bits for a message, 48 for the part of a claim that tells apart the deliveries of
one process), but drawn from a generator of this module's own, seeded from the operating
system (and again in a forked child), not read from it each time: ``uuid.uuid4()`` makes a
system call per id (``os.urandom``), which lets go of the GIL, and a worker whose threads
contend for it gives it to another thread at each one, a few ids a model call. The ids
are not secrets (Flower shows them); a generator the process's other code seeds (the
``random`` module's) is never used.
"""

from __future__ import annotations

import os
import random

_generator = random.Random()
os.register_at_fork(after_in_child=_generator.seed)


def random_hex(digits: int) -> str:
    """``digits`` random hexadecimal digits."""
    return f"{_generator.getrandbits(4 * digits):0{digits}x}"


def uuid4_text() -> str:
    """The text of a random version-4 UUID (what ``str(uuid.uuid4())`` writes)."""
    h = random_hex(32)
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}"


__all__ = ["random_hex", "uuid4_text"]
