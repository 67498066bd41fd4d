"""Fleet-wide figures for monitoring, read from Redis: queue depth, batches and runs in
flight, budget scopes (read-only; a few round trips per call: ``duet metrics`` calls it
once per scrape); and which worker runs the periodic sweep.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger, ScopeState

#: Newest batches looked at for the ones in flight (older ones are finished or expired).
RECENT_BATCHES = 1000


@dataclass(frozen=True, slots=True)
class BatchFigures:
    """One batch's counters."""

    batch_id: str
    total: int
    done: int
    usd: float

    @property
    def in_flight(self) -> int:
        return max(0, self.total - self.done)


def queue_depths(broker: Any, queues: Iterable[str] = keys.ALL_QUEUES) -> dict[str, int]:
    """Messages waiting in each queue (the Redis list Celery keeps per queue), on the
    broker's Redis client ``broker``."""
    names = list(queues)
    pipe = broker.pipeline(transaction=False)
    for name in names:
        for priority in keys.QUEUE_PRIORITIES:  # drafts wait in a list of their own
            pipe.llen(keys.queue_key(name, priority))
    lengths = [int(n) for n in pipe.execute()]
    step = len(keys.QUEUE_PRIORITIES)
    return {name: sum(lengths[i * step : (i + 1) * step]) for i, name in enumerate(names)}


def open_runs(client: Any) -> tuple[int, float | None]:
    """How many runs are not finished, and when the oldest of them was submitted (epoch
    seconds; None when there is none): one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.open_runs())
    pipe.zrange(keys.open_runs(), 0, 0, withscores=True)
    count, oldest = pipe.execute()
    return int(count), (float(oldest[0][1]) if oldest else None)


def recent_batches(client: Any, limit: int = RECENT_BATCHES) -> list[BatchFigures]:
    """The counters of the newest ``limit`` batches (two round trips)."""
    ids = [_s(b) for b in client.zrevrange(keys.batches_index(), 0, limit - 1)]
    pipe = client.pipeline(transaction=False)
    for batch_id in ids:
        pipe.hmget(keys.batch(batch_id), "total", "done", "usd")
    found = []
    for batch_id, (total, done, usd) in zip(ids, pipe.execute(), strict=True):
        if total is not None:  # expired meanwhile
            found.append(BatchFigures(batch_id, int(total), int(done or 0), float(usd or 0.0)))
    return found


def scopes_with_limits(ledger: BudgetLedger) -> list[str]:
    """The ``global:`` and ``user:`` scopes that were given limits."""
    return ledger.indexed_scopes()


def budget_states(ledger: BudgetLedger, scopes: Iterable[str]) -> list[ScopeState]:
    """Each scope's limits, spent, reserved and remaining (one script call per scope)."""
    return [ledger.get(scope) for scope in scopes]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_LEAD = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""


def take_sweeper_turn(client: Any, holder: str, ttl_s: int) -> bool:
    """Whether ``holder`` runs the sweep now: it does while it keeps renewing its turn
    (within ``ttl_s``); another worker takes over when it stops (died)."""
    return bool(client.eval(_LEAD, 1, keys.sweeper_lock(), holder, max(1, int(ttl_s))))
