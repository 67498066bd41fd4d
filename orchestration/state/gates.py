"""A batch's ``max_in_flight``: at most N of its runs started and not finished at any
moment, fleet-wide.

A run holds a place from its first transition (asked for in :meth:`BatchGate.enter`,
atomically) until its finishing transition, which gives the place back in the same
script that finishes it (``lua/run_transition.lua``), so a crash can neither keep a
finished run's place nor free a place twice. Runs without a place wait in the batch's
queue, in input order; a finish hands the free places on (:meth:`BatchGate.pass_on`).
Places are a set of run ids: a redelivered or repeated ask counts once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from orchestration.state import keys, scripts

#: The run-record field holding the batch's ``max_in_flight`` (absent: not held back).
GATE_FIELD = "gate"
#: The batch-record field holding it (for display, and for the sweep).
BATCH_FIELD = "max_in_flight"


def limit_of(record: Mapping[str, str]) -> int:
    """The ``max_in_flight`` a run (or batch) record names; 0 when none."""
    return int(record.get(GATE_FIELD) or record.get(BATCH_FIELD) or 0)


class BatchGate:
    """Asks for, hands on and reads places. Thread-safe: it holds only a pooled client."""

    def __init__(self, client: Any) -> None:
        self.r = client
        self._enter = scripts.register(client, "gate_enter")
        self._pass = scripts.register(client, "gate_pass")

    def enter(self, batch_id: str, run_id: str, limit: int) -> bool:
        """Whether ``run_id`` holds a place now (taking one if free); if not, it waits in
        the batch's queue (behind the runs queued at submit, which keep their order)."""
        got = self._enter(
            keys=[keys.batch_gate(batch_id), keys.batch_waiting(batch_id)],
            args=[run_id, limit, repr(time.time())],
        )
        return bool(got)

    def pass_on(self, batch_id: str, limit: int) -> list[str]:
        """Give the free places to the first waiting runs; their ids, for the caller to
        send each its first transition."""
        handed: list[str] = self._pass(
            keys=[keys.batch_gate(batch_id), keys.batch_waiting(batch_id)], args=[limit]
        )
        return handed

    @staticmethod
    def admit(pipe: Any, batch_id: str, placed: list[str], waiting: Mapping[str, int]) -> None:
        """Queue on ``pipe`` the writes of a submit: the runs ``placed`` are given the
        first places (they are sent at once), the ``waiting`` ones (id -> input position)
        queued for the next."""
        if placed:
            pipe.sadd(keys.batch_gate(batch_id), *placed)
        if waiting:
            pipe.zadd(keys.batch_waiting(batch_id), dict(waiting))

    def in_flight(self, batch_id: str) -> int:
        """How many runs of the batch hold a place now."""
        return int(self.r.scard(keys.batch_gate(batch_id)))

    def waiting(self, batch_id: str) -> int:
        """How many runs of the batch wait for a place now."""
        return int(self.r.zcard(keys.batch_waiting(batch_id)))

    def held_back(self, runs: Iterable[tuple[str, str]]) -> set[str]:
        """Of ``(batch id, run id)``, the runs waiting at a gate that is full: a finish
        will hand them a place, so nothing needs sending them now (the sweep's check)."""
        runs = list(runs)
        if not runs:
            return set()
        pipe = self.r.pipeline(transaction=False)
        for batch_id, run_id in runs:
            pipe.zscore(keys.batch_waiting(batch_id), run_id)
            pipe.scard(keys.batch_gate(batch_id))
            pipe.hget(keys.batch(batch_id), BATCH_FIELD)
        got = pipe.execute()
        held = set()
        for n, (_, run_id) in enumerate(runs):
            score, taken, limit = got[3 * n : 3 * n + 3]
            if score is not None and limit and int(taken) >= int(limit):
                held.add(run_id)
        return held


__all__ = ["BATCH_FIELD", "GATE_FIELD", "BatchGate", "limit_of"]
