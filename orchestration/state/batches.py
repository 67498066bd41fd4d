"""What a batch keeps beside its runs: the inputs it rejected, the finished-run stream as
a reader follows it, and the index of batches.

The batch record and its run list are written with the runs (see ``client.handles``);
this module owns the reads a face needs to follow a batch and the rejected inputs,
stored so that ``duet results``, ``progress()`` and the report account for every input
however the batch is followed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from orchestration.state import keys

#: Fields kept of a rejected input.
REJECTED_FIELDS = ("index", "id", "source", "line", "reason")


def add_rejected(client: Any, batch_id: str, rejected: Iterable[Mapping[str, Any]]) -> int:
    """Append rejected inputs (``index`` = position among all inputs, ``id``, ``source``,
    ``line``, ``reason``) to the batch; how many were stored."""
    rows = [json.dumps({f: r.get(f) for f in REJECTED_FIELDS}) for r in rejected]
    for start in range(0, len(rows), 1000):
        client.rpush(keys.batch_rejected(batch_id), *rows[start : start + 1000])
    return len(rows)


def rejected(client: Any, batch_id: str) -> list[dict[str, Any]]:
    """The batch's rejected inputs, in input order."""
    return [json.loads(raw) for raw in client.lrange(keys.batch_rejected(batch_id), 0, -1)]


def rejected_count(client: Any, batch_id: str) -> int:
    return int(client.llen(keys.batch_rejected(batch_id)))


def finished_since(
    client: Any, batch_id: str, after: str = "0-0", *, block_ms: int | None = None
) -> list[tuple[str, str, str]]:
    """Runs of the batch that finished after stream entry ``after``: ``(entry, run id,
    status)`` in the order they finished (a run resumed and finished again shows twice).
    Waits up to ``block_ms`` for the first one when given."""
    got = client.xread({keys.batch_events(batch_id): after}, block=block_ms, count=1000)
    return [(eid, f["run"], f["status"]) for _, entries in got or () for eid, f in entries]


def run_positions(client: Any, batch_id: str) -> dict[str, int]:
    """Run id -> its position among the batch's runs (the order they were submitted)."""
    positions: dict[str, int] = {}
    start, page = 0, 5000
    while ids := client.lrange(keys.batch_runs(batch_id), start, start + page - 1):
        positions.update((run_id, start + n) for n, run_id in enumerate(ids))
        start += page
    return positions


def record(client: Any, batch_id: str) -> dict[str, str]:
    """A batch's record and outcome counters (empty when there is no such batch)."""
    return dict(client.hgetall(keys.batch(batch_id)))


def recent(client: Any, limit: int = 20) -> list[tuple[str, dict[str, str]]]:
    """The newest batches, newest first: ``(batch id, its record)``; expired ones left out."""
    ids = client.zrevrange(keys.batches_index(), 0, max(limit, 1) - 1)
    pipe = client.pipeline(transaction=False)
    for batch_id in ids:
        pipe.hgetall(keys.batch(batch_id))
    return [(b, rec) for b, rec in zip(ids, pipe.execute(), strict=True) if rec]
