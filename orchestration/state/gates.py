"""A batch's ``max_in_flight``: at most N of its runs started and not finished at any
moment, fleet-wide.

A run holds a place from its first transition (asked for in :meth:`BatchGate.enter`,
atomically) until its finishing transition, which gives the place back in the same
script that finishes it (``lua/run_transition.lua``), so a crash can neither keep a
finished run's place nor free a place twice. Runs without a place wait in the batch's
queue, in input order, out of the sweep's index of unfinished runs; a finish hands the
free places on (:meth:`BatchGate.pass_on`), and so does the sweep, for every batch with
waiting runs (:meth:`BatchGate.hand_on_all`): a hand-on lost in a crash waits one sweep.
Places are a set of run ids: a redelivered or repeated ask counts once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from orchestration.state import keys, replicas, scripts
from orchestration.state.scripts import ScriptCall

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
        call = ScriptCall(
            self._enter,
            self._keys(batch_id),
            [run_id, limit, repr(time.time()), batch_id],
        )
        return bool(replicas.run_durable(self.r, [call])[0])

    def reenter(self, run_id: str) -> bool:
        """:meth:`enter` for a run ``resume`` re-opened or sends on: True when its batch
        has no ``max_in_flight`` or it holds a place; False: it waits in line (a finished
        run gave its place back, so a re-opened one asks again)."""
        batch_id, gate = self.r.hmget(keys.run(run_id), "batch_id", GATE_FIELD)
        limit = int(gate or 0)
        return not (limit and batch_id) or self.enter(batch_id, run_id, limit)

    def pass_on(self, batch_id: str, limit: int) -> list[str]:
        """Give the free places to the first waiting runs; their ids, for the caller to
        send each its next transition (its first, unless ``resume`` re-opened it)."""
        call = ScriptCall(self._pass, self._keys(batch_id), [limit, repr(time.time()), batch_id])
        handed: list[str] = replicas.run_durable(self.r, [call])[0]
        return handed

    @staticmethod
    def _keys(batch_id: str) -> list[str]:
        """The keys both gate scripts take (durable: a place a failover lost could be
        given twice, or a waiting run never sent)."""
        return [
            keys.batch_gate(batch_id),
            keys.batch_waiting(batch_id),
            keys.runs_moved(),
            keys.gated_batches(),
        ]

    def hand_on_all(self) -> list[tuple[str, str]]:
        """:meth:`pass_on` for every batch with waiting runs (the sweep's part): the
        ``(batch id, run id)`` handed a place, to send each its first transition. A batch
        whose record is gone is forgotten."""
        handed = []
        for batch_id in self.r.smembers(keys.gated_batches()):
            limit = self.r.hget(keys.batch(batch_id), BATCH_FIELD)
            if not limit:
                self.r.srem(keys.gated_batches(), batch_id)
                continue
            handed += [(batch_id, run_id) for run_id in self.pass_on(batch_id, int(limit))]
        return handed

    @staticmethod
    def admit(pipe: Any, batch_id: str, placed: list[str], waiting: Mapping[str, int]) -> None:
        """Queue on ``pipe`` the writes of a submit, after the runs': the runs ``placed``
        are given the first places (they are sent at once), the ``waiting`` ones (id ->
        input position) queued for the next, out of the sweep's index."""
        if placed:
            pipe.sadd(keys.batch_gate(batch_id), *placed)
        if waiting:
            pipe.zadd(keys.batch_waiting(batch_id), dict(waiting))
            pipe.zrem(keys.runs_moved(), *waiting)
            pipe.sadd(keys.gated_batches(), batch_id)

    @staticmethod
    def forget(pipe: Any, batch_id: str, run_ids: list[str]) -> None:
        """Queue on ``pipe`` the removal of runs that are gone (evicted) from the batch's
        places and line, so their places go to others."""
        if run_ids:
            pipe.srem(keys.batch_gate(batch_id), *run_ids)
            pipe.zrem(keys.batch_waiting(batch_id), *run_ids)

    def in_flight(self, batch_id: str) -> int:
        """How many runs of the batch hold a place now."""
        return int(self.r.scard(keys.batch_gate(batch_id)))

    def waiting(self, batch_id: str) -> int:
        """How many runs of the batch wait for a place now."""
        return int(self.r.zcard(keys.batch_waiting(batch_id)))


__all__ = ["BATCH_FIELD", "GATE_FIELD", "BatchGate", "limit_of"]
