"""Keeping the claims of calls in flight alive: one renewal thread per process.

A step's claim (and its budget hold) lives ``step_lease_s`` seconds unless renewed. While
this process waits on a model call, :class:`Leases` renews the claim and the hold every
third of the lease, all calls in one round trip. So the lease can be short: a worker that
dies mid-call frees its step (and its hold is charged, as its outcome is unknown) within
one lease, while a slow call that is alive keeps its step however long it takes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from orchestration.state.budgets import BudgetLedger
from orchestration.state.runs import RunStore
from orchestration.state.scripts import ScriptCall, run_scripts

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Call:
    """One call in flight: its step, its delivery's claim, its budget hold."""

    run_id: str
    key: str
    claimant: str
    #: The hold's id and scopes (no scopes: the run has no budget).
    hold_id: str
    scopes: tuple[str, ...]


class Leases:
    """The calls this process has in flight, renewed every ``lease_s / 3`` seconds."""

    def __init__(self, store: RunStore, ledger: BudgetLedger, lease_s: int) -> None:
        self.store = store
        self.ledger = ledger
        self.lease_s = lease_s
        self._calls: dict[int, Call] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next = 0

    @contextlib.contextmanager
    def held(self, call: Call) -> Iterator[None]:
        """Keep ``call``'s claim and hold alive while the block runs."""
        with self._lock:
            self._next += 1
            token = self._next
            self._calls[token] = call
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="duet-leases", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                del self._calls[token]

    def renew(self) -> int:
        """Renew every call in flight now; how many."""
        with self._lock:
            calls = list(self._calls.values())
        if not calls:
            return 0
        self.store.renew_claims([(c.run_id, c.key, c.claimant) for c in calls], self.lease_s)
        holds: list[ScriptCall] = [
            self.ledger.renew_call(c.hold_id, list(c.scopes), self.lease_s)
            for c in calls
            if c.scopes
        ]
        if holds:
            run_scripts(self.store.r, holds)
        return len(calls)

    def _loop(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.lease_s / 3):
            try:
                self.renew()
            except Exception as exc:  # noqa: BLE001 - Redis away: try again next beat
                log.warning("renewing claims of calls in flight failed: %s", exc)


__all__ = ["Call", "Leases"]
