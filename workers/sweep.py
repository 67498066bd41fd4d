"""The periodic sweep: one process at a time (a turn kept in Redis) sends on the runs that
stopped moving (:mod:`orchestration.services.sweeper`).

Every worker runs it in a daemon thread started when the worker is ready
(``worker_ready``; ``DUET_SWEEP_IN_WORKER=false`` turns the sweep off, not the rest): every
``DUET_SWEEP_INTERVAL_S`` it takes or keeps its turn, and, holding it, sweeps. A process
that dies loses its turn after two intervals; another takes it. ``duet sweep`` runs the
same sweep once, or as a process of its own (``--every``), for deployments that want the
sweeper apart from the workers; it takes turns with them.

Every :data:`RESTART_CHECK_S` the thread also looks for worker processes whose liveness
key lapsed (killed, lost) and sends the steps they had claimed on at once
(:class:`~orchestration.services.sweeper.Healer`; each death is handled by one process),
puts back the messages it noted it held, and, once every live process has noted what it
holds since, the messages no live process holds (the dead one took them after its note).

The thread also asks Redis every :data:`RESTART_CHECK_S` which server it is (``INFO
server``'s ``run_id``): after a restart (or a failover) it sweeps, :data:`RESTART_GRACE_S`
after the server came back, the runs that have not moved since, whatever
``DUET_SWEEP_AFTER_S`` says (a restart may lose messages: the broker's, and, with
``appendfsync everysec``, the last second of writes), on every worker, without the turn.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from celery.signals import worker_ready

from orchestration.defaults import RESTART_CHECK_S, RESTART_GRACE_S
from orchestration.services.coordinator import Dispatch
from orchestration.services.sweeper import Healer, Healing, RestartWatch, Sweeper, Transition
from orchestration.settings import get_settings
from orchestration.state.broker import is_redis, restore_delivered, restore_orphans
from orchestration.state.fleet import take_sweeper_turn
from workers import serverwatch
from workers.app import app
from workers.runtime import INFRA_ERRORS, coordinator_send, dispatch, get_store, publish_tools

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
    sweeping: bool = True,
) -> None:
    """Sweep on ``holder``'s turns every ``interval_s`` seconds until ``stop`` is set (not
    at all unless ``sweeping``), after a Redis restart, for dead processes, and watch the
    server's settings (see the module's docstring); ``sent`` is told what each sweep sent
    on. Redis or the broker away skips a turn."""
    interval = get_settings().sweep_interval_s if interval_s is None else interval_s
    tick = min(interval, RESTART_CHECK_S)
    watch = RestartWatch()
    came_back: float | None = None  # a restart whose sweep is still to do
    next_sweep = time.monotonic() + interval
    with _quietly("the first check of the Redis server"):
        _check_server(watch)
    healer = Healer(get_store(), process_ttl_s=get_settings().process_ttl_s)
    found_ms = 0  # deaths whose orphans (messages taken after the last note) are still to find
    next_watch = time.monotonic()
    reached = time.monotonic()  # when Redis last answered
    while not stop.wait(tick):
        if time.monotonic() >= next_watch:
            next_watch = time.monotonic() + serverwatch.WATCH_S
            with _quietly("the check of the Redis server's settings"):
                _watch_settings()
        with _quietly("the look for dead worker processes"):
            # A server that evicts may have dropped live processes' keys: trust none.
            healing = healer.heal() if serverwatch.refused() is None else Healing([], {}, [])
            found_ms = max(found_ms, healing.at_ms)
            put_back: set[str] = set()
            if healing.held:
                with _quietly("putting a dead worker's messages back"):
                    put_back = _put_back(healing.held)
            steps = healing.rest(put_back)  # all of them if none went back
            for step in steps:
                dispatch(step)
            if steps and sent is not None:
                sent(list(steps))
        if found_ms:
            with _quietly("putting a dead worker's orphaned messages back"):
                orphans = healer.orphans(found_ms)
                if orphans is not None:
                    _put_back_orphans(*orphans)
                    found_ms = 0
        with _quietly("the check of the Redis server"):
            back = _check_server(watch)
            reached = time.monotonic()
            if back is not None:
                log.warning(
                    "Redis came back (a new server process): sweeping the runs that "
                    "do not move again within %gs",
                    RESTART_GRACE_S,
                )
                came_back = back
                publish_tools()  # the new server may not know this worker's tools
                next_watch = time.monotonic()  # a new server: read its settings now
        _give_up_after(reached)
        if came_back is not None and time.time() >= came_back + RESTART_GRACE_S:
            with _quietly("the sweep after a restart"):
                sends = sweep_once(None, after_s=max(0.0, time.time() - came_back))
                came_back = None
                if sends and sent is not None:
                    sent(sends)
        if not sweeping or time.monotonic() < next_sweep:
            continue
        next_sweep = time.monotonic() + interval
        with _quietly("sweep"):
            sends = sweep_once(holder, after_s=after_s, interval_s=interval)
            if sends and sent is not None:
                sent(sends)


def _give_up_after(reached: float) -> None:
    """Exit (code 3) once Redis has not answered for ``DUET_REDIS_UNREACHABLE_EXIT_S``
    (unset: never), for the supervisor to start the worker again; its unacknowledged
    messages go back to their queues as after any death."""
    limit = get_settings().redis_unreachable_exit_s
    away = time.monotonic() - reached
    if limit is not None and away > limit:
        log.error(
            "Redis not reached for %.0fs (DUET_REDIS_UNREACHABLE_EXIT_S=%g): exiting for the "
            "supervisor to start this worker again",
            away,
            limit,
        )
        logging.shutdown()
        os._exit(3)


def _put_back(held: dict[str, str]) -> set[str]:
    """Put the messages a dead worker held back on their queues (a Redis broker: AMQP
    brokers do it themselves); the tags put back."""
    if not held or not is_redis(app.conf.broker_url):
        return set()
    with app.connection_for_write() as conn:
        back = restore_delivered(conn.default_channel, held)
    log.warning(
        "put %d of %d message(s) a dead worker held back on their queues", len(back), len(held)
    )
    return back


def _put_back_orphans(held: set[str], before: float) -> None:
    """Put back on their queues the messages delivered before ``before`` that no live
    worker holds (``held``): a dead worker took them after its last note of what it held,
    and without this they would wait for the visibility timeout."""
    if not is_redis(app.conf.broker_url):
        return
    with app.connection_for_write() as conn:
        back = restore_orphans(conn.default_channel, held, before)
    if back:
        log.warning(
            "put %d message(s) a dead worker took after its last note back on their queues",
            len(back),
        )


def _watch_settings() -> None:
    """Read the Redis's settings (:mod:`workers.serverwatch`)."""
    url = get_settings().redis_url
    if url:  # the embedded Redis is this process's own
        serverwatch.check(get_store().r, url)


def _check_server(watch: RestartWatch) -> float | None:
    """When the Redis server came back, if it is a new one since the last check."""
    info = get_store().r.info("server")
    return watch.seen(str(info["run_id"]), float(info["uptime_in_seconds"]), time.time())


class _quietly:
    """Log and swallow what stops one turn of the sweep thread (Redis or the broker away,
    a bad record): the thread must outlive it."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _: object
    ) -> bool:
        if exc is None:
            return False
        if isinstance(exc, INFRA_ERRORS):  # Redis or the broker away: next turn
            log.warning("%s skipped: %s: %s", self.what, type(exc).__name__, exc)
        elif isinstance(exc, Exception):
            log.error("%s failed", self.what, exc_info=exc)
        else:
            return False
        return True


def start() -> None:
    """Start this process's sweep thread (once)."""
    global _thread
    with _started:
        if _thread is not None and _thread.is_alive():
            return
        _thread = threading.Thread(
            target=sweep_every,
            args=(holder_id(), threading.Event()),
            kwargs={"sweeping": get_settings().sweep_in_worker},
            name="duet-sweep",
            daemon=True,
        )
        _thread.start()


@worker_ready.connect(weak=False)
def _start_with_worker(**_: object) -> None:
    start()
