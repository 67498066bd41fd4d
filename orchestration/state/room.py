"""The room a Redis with a ``maxmemory`` has left for data: whether a write it refused for
memory (``OOM``) could ever fit, or met a passing shortage (others' buffers, a cache
about to give room back)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import redis


@dataclass(frozen=True)
class Room:
    """Bytes a server can still take: its ``maxmemory`` less what it holds, its clients'
    buffers (a refused command's arguments among them) not counted."""

    left: int
    maxmemory: int

    @property
    def full(self) -> bool:
        """Whether the server is full as such (less than :data:`FULL_SHARE` of its
        ``maxmemory`` left): every write may be refused until room is made, which no
        single write's size explains."""
        return self.left < FULL_SHARE * self.maxmemory

    def fits(self, size: int) -> bool:
        """Whether a script given ``size`` bytes of arguments could write them with no
        other client busy: Redis holds them twice when it checks the script's write (the
        arguments, and the command the script makes of them)."""
        return SCRIPT_COPIES * size <= self.left


#: The share of ``maxmemory`` below which a server's room counts as gone (:attr:`Room.full`).
FULL_SHARE = 0.05
#: Copies of its arguments Redis holds when a script's write is checked against
#: ``maxmemory`` (measured on Redis 7.0: a 4 MB argument refused with 6.4 MB of room).
SCRIPT_COPIES = 2


def room_of(client: Any) -> Room | None:
    """The :class:`Room` of the server behind ``client`` (``INFO memory``, and ``CLIENT
    LIST`` for its clients' buffers now: ``INFO``'s own count of them lags), which a full
    server still answers; None without a ``maxmemory`` or when it will not say."""
    try:
        memory = client.info("memory")
    except (redis.RedisError, OSError):
        return None
    maxmemory = int(memory.get("maxmemory") or 0)
    if not maxmemory:
        return None
    buffers = int(memory.get("mem_clients_normal") or 0)
    with contextlib.suppress(redis.RedisError, OSError, ValueError):
        buffers = sum(
            int(c.get("tot-mem") or 0)
            for c in client.client_list()
            if not set(str(c.get("flags", ""))) & _NOT_NORMAL
        )
    held = (
        int(memory.get("used_memory") or 0)
        - buffers
        - int(memory.get("mem_not_counted_for_evict") or 0)
    )
    return Room(maxmemory - held, maxmemory)


#: ``CLIENT LIST`` flags of clients that are no normal client (a replica, a primary),
#: whose buffers Redis counts apart.
_NOT_NORMAL = {"S", "M"}
