"""A Celery worker running in threads of the current process (the embedded default).

Used by ``Team.run`` and ``duet run`` when no ``DUET_REDIS_URL`` is set: the same tasks,
pool and queues as ``celery -A workers worker``, without another process to manage.
"""

from __future__ import annotations

import threading

from celery.worker import WorkController
from kombu.asynchronous import set_event_loop

from orchestration.state import keys
from workers import runtime
from workers.app import app, configure
from workers.secrets import redact_process_logs


class _Controller(WorkController):
    """A WorkController that tells us when its consumer is ready."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.ready = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer: object) -> None:
        self.ready.set()


#: In-process workers of this process started and not yet stopped (the liveness key is
#: the process's: the last to stop stops renewing it).
_running: set[int] = set()
_running_lock = threading.Lock()


class InProcessWorker:
    """Start with :meth:`start`, stop with :meth:`stop` (or use as a context manager)."""

    def __init__(
        self, redis_url: str, *, concurrency: int = 64, queues: tuple[str, ...] = keys.ALL_QUEUES
    ):
        self.redis_url = redis_url
        self.concurrency = concurrency
        self.queues = queues
        self._controller: _Controller | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> InProcessWorker:
        configure(redis_url=self.redis_url)
        runtime.reset()
        # Celery does not set up logging here: redact this process's own handlers.
        redact_process_logs()
        # Pool threads have no "current app" of their own: make ours the default too, or
        # Celery hands them its unconfigured default app (and task.retry goes nowhere).
        app.set_current()
        app.set_default()
        # Celery's worker takes kombu's process-wide event loop when one is set: that of an
        # earlier in-process worker whose thread has not ended (its stop timed out). Two
        # consumers on one hub read each other's sockets (a socket timeout, then "I/O
        # operation on closed file" ends both). This worker gets a hub of its own.
        set_event_loop(None)
        self._controller = _Controller(
            app=app,
            pool_cls="threads",
            concurrency=self.concurrency,
            queues=list(self.queues),
            loglevel="WARNING",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            hostname=f"duet-inprocess-{id(self):x}@localhost",
        )
        self._thread = threading.Thread(
            target=self._controller.start, name="duet-inprocess-worker", daemon=True
        )
        self._thread.start()
        with _running_lock:
            _running.add(id(self))
        if not self._controller.ready.wait(timeout_s):
            raise RuntimeError(f"in-process worker did not start within {timeout_s}s")
        if keys.QUEUE_TOOLS in self.queues:  # its tools known before the first submit
            runtime.publish_tools()
        return self

    @property
    def hub(self) -> object | None:
        """The event loop this worker's consumer runs on (None when it is not running)."""
        return None if self._controller is None else self._controller.hub

    def stop(self, timeout_s: float = 10.0) -> None:
        from workers.providers import close_providers

        if self._controller is not None:
            self._controller.stop(in_sighandler=False, exitcode=0)
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._controller = None
        self._thread = None
        close_providers()
        with _running_lock:
            was_running = id(self) in _running
            _running.discard(id(self))
            last = was_running and not _running
        if last:
            # Else its renewals outlive the worker: against an embedded Redis stopped
            # next, each one a warning ("renewing this process's liveness key failed").
            runtime.stop_liveness()

    def __enter__(self) -> InProcessWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
