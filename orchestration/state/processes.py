"""Which worker processes are alive, and the step claims they make.

Every process that calls models keeps a liveness key (:func:`orchestration.state.keys.process`)
with a short TTL, renewed every few seconds by one thread (see
:mod:`orchestration.services.liveness`): one ``SET`` per process, never per call. A step
claim names its process (``<process id>:<delivery>``), so a delivery that finds the step
claimed can tell a live holder from a dead one: a claim whose process key is gone is
taken over at once (:meth:`orchestration.state.runs.RunStore.take_over`), instead of after
the claim's lease. Not right after a Redis outage, though: every liveness key lapses in
one then, so a claim is presumed dead only once the fleet has been renewing its keys
without a break for a whole TTL again (:func:`orchestration.state.keys.processes_since`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from orchestration.state import keys, scripts
from orchestration.state.ids import random_hex

#: How a process id begins. A claim without it (made by an older worker, which kept no
#: liveness key) is never presumed dead: it is left to its lease.
MARK = "p."


def new_process_id() -> str:
    """An id for this process, unique across hosts and restarts (host, pid, random)."""
    host = socket.gethostname().replace(":", "_")[:40]
    return f"{MARK}{host}.{os.getpid()}.{random_hex(8)}"


def new_claimant(process_id: str) -> str:
    """A claim of its own for one delivery of a step, made by ``process_id``."""
    return f"{process_id}:{random_hex(12)}"


def process_of(claim: str) -> str | None:
    """The process a claim names; None for a claim that names none (an older worker's)."""
    process_id, sep, _ = claim.rpartition(":")
    return process_id if sep and process_id.startswith(MARK) else None


def mark_alive(client: Any, process_id: str, ttl_s: int) -> None:
    """Note that ``process_id`` is alive for the next ``ttl_s`` seconds (and that the
    fleet's signs of life go on: :func:`orchestration.state.keys.processes_since`)."""
    scripts.register(client, "process_beat")(
        keys=[keys.process(process_id), keys.processes_since(), keys.processes()],
        args=[max(1, int(ttl_s * 1000)), process_id],
    )


def note_held(client: Any, process_id: str, held: Mapping[str, str], keep_s: int) -> None:
    """Replace ``process_id``'s note of the messages it holds (tag -> run id), kept
    ``keep_s`` seconds (one transaction)."""
    key = keys.process_held(process_id)
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    if held:
        pipe.hset(key, mapping=dict(held))
        pipe.expire(key, max(1, int(keep_s)))
    pipe.execute()


def take_held(client: Any, process_ids: Sequence[str]) -> dict[str, str]:
    """The messages the (dead) processes held as of their last sign of life, tag -> run
    id; their notes are dropped."""
    if not process_ids:
        return {}
    pipe = client.pipeline(transaction=True)
    for p in process_ids:
        pipe.hgetall(keys.process_held(p))
    pipe.delete(*(keys.process_held(p) for p in process_ids))
    held: dict[str, str] = {}
    for found in pipe.execute()[:-1]:
        held.update({_text(k): _text(v) for k, v in found.items()})
    return held


def lapsed(client: Any, ttl_s: int, limit: int = 100) -> list[str]:
    """The processes that stopped saying they are alive (their liveness key gone), each
    returned to one caller only (taken off the fleet's index); none right after a Redis
    outage (see :func:`orchestration.state.keys.processes_since`)."""
    ttl_ms = max(1, int(ttl_s * 1000))
    now_ms = int(time.time() * 1000)
    old = client.zrangebyscore(keys.processes(), "-inf", now_ms - ttl_ms, start=0, num=limit)
    if not old:
        return []
    ids = [_text(p) for p in old]
    gone = scripts.register(client, "process_lapsed")(
        keys=[keys.processes(), keys.processes_since(), *(keys.process(p) for p in ids)],
        args=[ttl_ms, *ids],
    )
    return [_text(p) for p in gone]


def held_since(client: Any, since_ms: int) -> set[str] | None:
    """The delivery tags every worker process notes it holds, once each live one (its
    liveness key there) has said it is alive after ``since_ms`` (Redis time), so that its
    note covers what it took before; None until then. A process whose key is gone does not
    hold this up, and its note is kept (its own death puts those back by tag)."""
    index = client.zrange(keys.processes(), 0, -1, withscores=True)
    procs = [(_text(p), int(score)) for p, score in index]
    pipe = client.pipeline(transaction=False)
    for process_id, _ in procs:
        pipe.exists(keys.process(process_id))
        pipe.hkeys(keys.process_held(process_id))
    found = pipe.execute() if procs else []
    tags: set[str] = set()
    for n, (_, beat) in enumerate(procs):
        if found[2 * n] and beat <= since_ms:
            return None  # a live process whose note may not hold what it took yet
        tags.update(_text(t) for t in found[2 * n + 1])
    return tags


def redis_ms(client: Any) -> int:
    """The Redis server's time, epoch ms (what signs of life are scored by)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def alive(client: Any, claims: Sequence[str]) -> list[bool]:
    """For each claim, whether its process may still hold it (one round trip): its
    liveness key exists, or the claim names no process (left to its lease)."""
    procs = [process_of(c) for c in claims]
    named = [p for p in procs if p is not None]
    found: Iterator[Any] = iter(())
    if named:
        pipe = client.pipeline(transaction=False)
        for p in named:
            pipe.exists(keys.process(p))
        found = iter(pipe.execute())
    return [True if p is None else bool(next(found)) for p in procs]


__all__ = [
    "MARK",
    "alive",
    "held_since",
    "redis_ms",
    "lapsed",
    "mark_alive",
    "note_held",
    "take_held",
    "new_claimant",
    "new_process_id",
    "process_of",
]
