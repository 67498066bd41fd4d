"""The embedded default: an embedded Redis plus an in-process worker, for one machine.

Started on first use when ``DUET_REDIS_URL`` is unset (by the CLI, or by the client API
through :mod:`orchestration.client.backend`), stopped when the process exits: normally,
on an exception, on Ctrl-C, and on SIGTERM or SIGHUP (which, started from the main
thread, end the process through ``SystemExit`` so the cleanup runs; their default action
would kill it and leave the embedded Redis running).
"""

from __future__ import annotations

import atexit
import signal
import threading

from duet.embedded.server import EmbeddedRedis
from orchestration.settings import get_settings
from orchestration.state import connection
from workers.inprocess import InProcessWorker


class LocalCluster:
    """An embedded Redis and an in-process worker pool."""

    def __init__(self, *, concurrency: int = 64) -> None:
        self.concurrency = concurrency
        self.redis: EmbeddedRedis | None = None
        self.worker: InProcessWorker | None = None

    @property
    def url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    def start(self) -> LocalCluster:
        self.redis = EmbeddedRedis().start()
        connection.use_redis(self.redis.url)
        try:
            self.worker = InProcessWorker(self.redis.url, concurrency=self.concurrency)
            self.worker.start()
        except BaseException:
            self.redis.stop()
            raise
        return self

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_lock = threading.Lock()
_cluster: LocalCluster | None = None


def ensure_backend() -> str:
    """The Redis URL to use: DUET_REDIS_URL, else a process-wide embedded cluster."""
    global _cluster
    configured = get_settings().redis_url
    if configured:
        return configured
    with _lock:
        if _cluster is None:
            _cluster = LocalCluster(concurrency=min(get_settings().worker_concurrency, 64)).start()
            atexit.register(shutdown)
            _exit_cleanly_on_signals()
        # Someone may have pointed the process elsewhere since (connection.reset()).
        connection.use_redis(_cluster.url)
        return _cluster.url


#: Signals whose default action would end the process without running ``atexit``.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _exit_cleanly_on_signals() -> None:
    """Make SIGTERM and SIGHUP raise ``SystemExit(128 + signal)``, where nobody handles
    them yet (only the main thread may set handlers; another thread's caller keeps
    its own)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _raise_exit)


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def shutdown() -> None:
    """Stop the embedded cluster, if one was started."""
    global _cluster
    with _lock:
        if _cluster is not None:
            _cluster.stop()
            _cluster = None
