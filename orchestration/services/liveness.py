"""This process's sign of life: one liveness key, renewed by one thread.

A step claim names the process that made it (:func:`orchestration.state.processes.new_claimant`).
While the process lives, :class:`Liveness` renews its key every third of ``ttl_s`` (one
``SET`` per process, whatever the number of calls in flight); once it dies, its key is
gone within ``ttl_s`` and its claims are taken over at once instead of after their lease.
The key is written (synchronously) before the first claim is made, so a claim never
names a process that has not said it is alive.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from orchestration.state.processes import mark_alive, new_claimant, new_process_id

log = logging.getLogger(__name__)


class Liveness:
    """The liveness key of this process (a new id after a fork)."""

    def __init__(
        self, client: Any, ttl_s: int, also: Callable[[Any, int], None] | None = None
    ) -> None:
        self.client = client
        self.ttl_s = ttl_s
        #: Said with every sign of life (client, TTL): what the process publishes beside
        #: it (its key policy, :mod:`orchestration.state.keypolicies`).
        self.also = also
        self._lock = threading.Lock()
        self._pid = -1
        self._id = ""
        self._stop = threading.Event()

    @property
    def process_id(self) -> str:
        """This process's id, its liveness key written and kept renewed from now on."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    process_id = new_process_id()
                    self._beat(process_id)
                    self._id = process_id
                    self._pid = os.getpid()
                    threading.Thread(
                        target=self._loop, args=(process_id,), name="duet-liveness", daemon=True
                    ).start()
        return self._id

    def start(self) -> str:
        """Write this process's liveness key now and keep renewing it; its id."""
        return self.process_id

    def claimant(self) -> str:
        """A new claim for one delivery of a step, naming this process."""
        return new_claimant(self.process_id)

    def stop(self) -> None:
        """Stop renewing (the key lapses within ``ttl_s``)."""
        self._stop.set()

    def _beat(self, process_id: str) -> None:
        mark_alive(self.client, process_id, self.ttl_s)
        if self.also is not None:
            self.also(self.client, self.ttl_s)

    def _loop(self, process_id: str) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._beat(process_id)
            except Exception as exc:  # noqa: BLE001 - Redis away: try again next beat
                log.warning("renewing this process's liveness key failed: %s", exc)


__all__ = ["Liveness"]
