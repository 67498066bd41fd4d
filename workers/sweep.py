"""The periodic sweep in every worker: one worker at a time (a turn kept in Redis) sends
on the runs that stopped moving (:mod:`orchestration.services.sweeper`).

Started when the worker is ready (``worker_ready``), a daemon thread: every
``DUET_SWEEP_INTERVAL_S`` it takes or keeps its turn, and, holding it, sweeps. A worker
that dies loses its turn after two intervals; another takes it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from celery.signals import worker_ready

from orchestration.services.coordinator import Dispatch
from orchestration.services.sweeper import Sweeper, Transition
from orchestration.settings import get_settings
from orchestration.state.fleet import take_sweeper_turn
from workers.runtime import INFRA_ERRORS, coordinator_send, dispatch, get_store

log = logging.getLogger(__name__)

_started = threading.Lock()
_thread: threading.Thread | None = None


def sweep_once(holder: str) -> int | None:
    """Sweep if it is ``holder``'s turn; how many runs were sent on (None: not its turn)."""
    settings = get_settings()
    store = get_store()
    if not take_sweeper_turn(store.r, holder, int(settings.sweep_interval_s * 2) + 1):
        return None
    sends = Sweeper(store, after_s=settings.sweep_after_s).sweep()
    for send in sends:
        if isinstance(send, Transition):
            coordinator_send(send.run_id, send.seq)
        elif isinstance(send, Dispatch):
            dispatch(send)
    return len(sends)


def _loop(holder: str, stop: threading.Event) -> None:
    interval = get_settings().sweep_interval_s
    while not stop.wait(interval):
        try:
            sweep_once(holder)
        except INFRA_ERRORS as exc:  # Redis or the broker away: next interval
            log.warning("sweep skipped: %s: %s", type(exc).__name__, exc)
        except Exception:  # noqa: BLE001 - the sweeper must outlive a bad record
            log.exception("sweep failed")


def start() -> None:
    """Start this process's sweep thread (once)."""
    global _thread
    with _started:
        if _thread is not None and _thread.is_alive():
            return
        holder = f"{socket.gethostname()}:{os.getpid()}"
        _thread = threading.Thread(
            target=_loop, args=(holder, threading.Event()), name="duet-sweep", daemon=True
        )
        _thread.start()


@worker_ready.connect(weak=False)
def _start_with_worker(**_: object) -> None:
    start()
