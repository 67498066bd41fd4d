"""The periodic sweep: one process at a time (a turn kept in Redis) sends on the runs that
stopped moving (:mod:`orchestration.services.sweeper`).

Every worker runs it in a daemon thread started when the worker is ready
(``worker_ready``; ``DUET_SWEEP_IN_WORKER=false`` turns that off): every
``DUET_SWEEP_INTERVAL_S`` it takes or keeps its turn, and, holding it, sweeps. A process
that dies loses its turn after two intervals; another takes it. ``duet sweep`` runs the
same sweep once, or as a process of its own (``--every``), for deployments that want the
sweeper apart from the workers; it takes turns with them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from celery.signals import worker_ready

from orchestration.services.coordinator import Dispatch
from orchestration.services.sweeper import Sweeper, Transition
from orchestration.settings import get_settings
from orchestration.state.fleet import take_sweeper_turn
from workers.runtime import INFRA_ERRORS, coordinator_send, dispatch, get_store

log = logging.getLogger(__name__)

_started = threading.Lock()
_thread: threading.Thread | None = None

#: What one sweep sent on: the coordinator's transition or the step again, per run.
Sends = list[Dispatch | Transition]


def holder_id() -> str:
    """This process, as the holder of the sweeper's turn."""
    return f"{socket.gethostname()}:{os.getpid()}"


def sweep_once(
    holder: str | None, *, after_s: float | None = None, interval_s: float | None = None
) -> Sends | None:
    """Send on the runs that have not moved for ``after_s`` seconds (default
    ``DUET_SWEEP_AFTER_S``); what was sent. With a ``holder``, only on its turn (kept for
    two ``interval_s``, default ``DUET_SWEEP_INTERVAL_S``): None when it is another's."""
    settings = get_settings()
    store = get_store()
    interval = settings.sweep_interval_s if interval_s is None else interval_s
    if holder is not None and not take_sweeper_turn(store.r, holder, int(interval * 2) + 1):
        return None
    sends = Sweeper(store, after_s=settings.sweep_after_s if after_s is None else after_s).sweep()
    for send in sends:
        if isinstance(send, Transition):
            coordinator_send(send.run_id, send.seq)
        elif isinstance(send, Dispatch):
            dispatch(send)
    return sends


def sweep_every(
    holder: str,
    stop: threading.Event,
    *,
    interval_s: float | None = None,
    after_s: float | None = None,
    sent: Callable[[Sends], None] | None = None,
) -> None:
    """Sweep on ``holder``'s turns every ``interval_s`` seconds until ``stop`` is set;
    ``sent`` is told what each sweep sent on. Redis or the broker away skips a sweep."""
    interval = get_settings().sweep_interval_s if interval_s is None else interval_s
    while not stop.wait(interval):
        try:
            sends = sweep_once(holder, after_s=after_s, interval_s=interval)
        except INFRA_ERRORS as exc:  # Redis or the broker away: next interval
            log.warning("sweep skipped: %s: %s", type(exc).__name__, exc)
            continue
        except Exception:  # noqa: BLE001 - the sweeper must outlive a bad record
            log.exception("sweep failed")
            continue
        if sends and sent is not None:
            sent(sends)


def start() -> None:
    """Start this process's sweep thread (once)."""
    global _thread
    with _started:
        if _thread is not None and _thread.is_alive():
            return
        _thread = threading.Thread(
            target=sweep_every, args=(holder_id(), threading.Event()), name="duet-sweep",
            daemon=True,
        )  # fmt: skip
        _thread.start()


@worker_ready.connect(weak=False)
def _start_with_worker(**_: object) -> None:
    if get_settings().sweep_in_worker:
        start()
