"""The Celery application: broker, serialisation, delivery guarantees, routing, pool.

Start a worker with ``celery -A workers worker`` (or ``duet worker``). Settings come
from ``DUET_*`` environment variables (see :mod:`orchestration.settings`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys

import redis
from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    after_task_publish,
    before_task_publish,
    celeryd_init,
    worker_init,
    worker_process_shutdown,
    worker_shutdown,
)
from kombu import Queue

from orchestration.core.agents import DEFAULT_TIMEOUT_S, check_call_timeout
from orchestration.core.errors import ConfigError
from orchestration.settings import get_settings
from orchestration.state import fastpaths, keys
from orchestration.state.broker import broker_config, is_redis, visibility_timeout_of
from workers import celery_ext, publish

log = logging.getLogger(__name__)

app = Celery("duet", include=["workers.tasks"], amqp=celery_ext.amqp())


def _config(broker_url: str | None) -> dict[str, object]:
    settings = get_settings()
    return {
        **broker_config(broker_url, settings),
        "result_backend_thread_safe": True,
        # At-least-once delivery: a message is acked after its task ran, and a worker that
        # dies mid-task gives it back. Steps and the coordinator are idempotent for this.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Workers wait on model APIs: threads hold hundreds of calls in flight in one process.
        "worker_pool": "threads",
        "worker_concurrency": settings.worker_concurrency,
        "broker_pool_limit": max(10, min(settings.worker_concurrency, 100)),
        "task_default_queue": keys.QUEUE_COORDINATOR,
        # A plain `celery -A workers worker` consumes all three queues; -Q picks some.
        "task_queues": [Queue(name, routing_key=name) for name in keys.ALL_QUEUES],
        # Flower and `celery events` see every task; arguments are ids, so nothing leaks.
        # (No task-sent events: they cost a publish per message and Flower needs none.)
        "worker_send_task_events": True,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        # On a lost broker connection, tasks in flight run to their end (a step's model
        # call is not abandoned half-way); their messages come back after the visibility
        # timeout and the step's stored result or claim makes the redelivery a no-op.
        # (Celery 5 still warns of its future default on each reconnect.)
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }


#: Options the tasks add to every ``send_task`` (set by :func:`configure`). On the Redis
#: transport a message to a queue goes straight onto its list (kombu's anonymous
#: exchange), so declaring the queue first is a no-op that costs ~40 us per send; other
#: brokers (RabbitMQ) keep the declaration, which creates a queue no worker made yet.
SEND_OPTIONS: dict[str, object] = {}
_direct_push = False


def direct_push() -> bool:
    """Whether the tasks push their messages themselves (:mod:`workers.publish`: one
    LPUSH, no ``send_task``): on a Redis broker while the ``publish`` fast path is on
    (set by :func:`configure`) and no receiver is connected to Celery's
    ``before_task_publish`` / ``after_task_publish``, which only ``send_task`` sends."""
    return _direct_push and not (before_task_publish.receivers or after_task_publish.receivers)


def configure(redis_url: str | None = None, broker_url: str | None = None) -> Celery:
    """(Re)point the app at a broker: DUET_BROKER_URL, else the run-state Redis."""
    global _direct_push
    settings = get_settings()
    config = _config(broker_url or settings.broker_url or redis_url or settings.redis_url)
    app.conf.update(config)
    SEND_OPTIONS.clear()
    broker = config["broker_url"]
    _direct_push = is_redis(broker) and fastpaths.enabled("publish")
    if config["broker_transport"] is not None:  # our Redis transport
        SEND_OPTIONS["declare"] = []
    # Pools opened for the previous broker would keep sending there (as after a fork).
    celery_ext.forget_pools(app)
    publish.use_broker(str(broker) if _direct_push else None)
    return app


# A URL Duet cannot read is refused in one line before a worker starts
# (:func:`_check_schemes`), and by every client when it connects: not at import.
with contextlib.suppress(ConfigError):
    configure()


@worker_init.connect(weak=False)
def _preload_providers(**_: object) -> None:
    """Import the vendor SDKs named in DUET_PRELOAD_PROVIDERS before taking work.

    The SDKs are imported lazily (seconds each); a worker that serves a vendor can pay
    that at start instead of on its first call.
    """
    from workers.providers import PROVIDER_MODULES

    for name in get_settings().preload_providers:
        module = PROVIDER_MODULES[name].partition(":")[0]
        importlib.import_module(module).preload()
        logging.getLogger(__name__).info("preloaded provider %s", name)


@after_setup_logger.connect(weak=False)
def _setup_logs(logger: logging.Logger, **_: object) -> None:
    """JSON lines with DUET_LOG_FORMAT=json; Celery's per-task INFO lines off unless
    DUET_LOG_TASKS (before the worker builds its task strategies, which read the level)."""
    from workers import logs

    settings = get_settings()
    if not settings.log_tasks:
        logs.quiet_task_lines()
    logs.quiet_reconnects(logger)
    if settings.log_format == "json":
        logs.use_json(logger)
    else:
        logs.use_terminal_safe_text(logger)


@after_setup_task_logger.connect(weak=False)
def _setup_task_logs(logger: logging.Logger, **_: object) -> None:
    from workers import logs

    if get_settings().log_format == "json":
        logs.use_json(logger)
    else:
        logs.use_terminal_safe_text(logger)


#: Why a worker without a cluster refuses to start: ``duet worker``, ``celery -A workers
#: worker`` and the image alike (Celery would try ``amqp://guest@localhost`` instead).
NO_CLUSTER = "a worker needs a cluster: set DUET_REDIS_URL (e.g. redis://localhost:6379/0)"


def check_cluster(broker_url: str | None) -> None:
    """Refuse a worker with no broker: ``broker_url`` is the app's (pointed at one by
    :func:`configure`, from ``DUET_BROKER_URL`` or ``DUET_REDIS_URL``), or the one
    ``duet worker`` reads from the environment before Celery starts.

    Raises:
        ConfigError: :data:`NO_CLUSTER`.
    """
    if not broker_url:
        raise ConfigError(NO_CLUSTER)


def check_visibility_timeout() -> None:
    """Refuse a worker whose broker would hand a step to another worker before a model
    call of the default timeout (``Agent(timeout_s=...)``, 120 s) ends.

    Raises:
        ConfigError: naming both timeouts and the variables to change.
    """
    visibility = visibility_timeout_of(get_settings())
    if visibility is not None:
        check_call_timeout(
            "this worker will not start: the agents' default (Agent(timeout_s=...))",
            DEFAULT_TIMEOUT_S,
            visibility,
        )


@celeryd_init.connect(weak=False)
def _check_schemes(**_: object) -> None:
    """Refuse a Redis URL Duet does not serve (its scheme, a Sentinel URL it cannot read,
    a TLS file not there) before Celery builds its broker connection (kombu's error there
    is a traceback): one line, exit 2."""
    from orchestration.state import preflight

    settings = get_settings()
    urls = {"DUET_REDIS_URL": settings.redis_url}
    broker = settings.broker_url or ""
    if "redis" in broker.partition("://")[0] or "sentinel" in broker.partition("://")[0]:
        urls["DUET_BROKER_URL"] = broker
    try:
        for variable, url in urls.items():
            if url:
                preflight.check_scheme(url, variable)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


@worker_init.connect(weak=False)
def _check_at_start(**_: object) -> None:
    # The timeouts, and whether the endpoint fast path runs (its notice, if off, at start;
    # httpx2 is imported here, not by every process importing this module: ~0.14 s).
    # Celery logs and ignores what a signal handler raises: exit (code 2) instead.
    try:
        check_cluster(app.conf.broker_url)  # before anything connects
        check_visibility_timeout()
        fastpaths.enabled("endpoint")
        check_servers()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def check_servers() -> None:
    """Refuse a Redis that cannot keep Duet's state (:mod:`orchestration.state.preflight`);
    one that cannot be reached now is checked by nothing more (the worker waits for it).

    Raises:
        ConfigError: the URL's scheme, the server's eviction policy, a cluster, a password
            the server (or its sentinels) refused, a failed TLS handshake.
    """
    from orchestration.state import connection, preflight

    settings = get_settings()
    servers = {settings.redis_url: "DUET_REDIS_URL"}
    broker = settings.broker_url
    if is_redis(broker):
        servers.setdefault(broker, "DUET_BROKER_URL")
    for url, variable in servers.items():
        if not url:
            continue
        try:
            for warning in preflight.check_server(url, variable):
                log.warning("%s", warning)
        except (redis.RedisError, OSError) as exc:
            refused = connection.refused_login(url, variable, exc)
            if refused is not None:  # a wrong password or CA does not get better by waiting
                raise refused from None
            log.warning(
                "%s not checked at start (%s): Duet needs maxmemory-policy "
                "noeviction and no cluster",
                variable,
                exc,
            )


@worker_init.connect(weak=False)
def _register_key_variables(**_: object) -> None:
    """Secret from the first task: the key-shaped variables of the environment and every
    variable a stored spec names (:mod:`workers.spec_keys`)."""
    from orchestration.state import connection
    from workers import secrets, spec_keys

    secrets.scan_environment()
    away: tuple[type[BaseException], ...] = (*connection.INFRA_ERRORS, ConfigError)
    try:
        spec_keys.register_stored(connection.get_redis())
    except away as exc:  # Redis away: each adapter still registers its own
        log.warning("the stored specs' key variables not read at start: %s", exc)


@worker_init.connect(weak=False)
def _serve_metrics(**_: object) -> None:
    """Serve Prometheus metrics on DUET_METRICS_PORT (``duet worker --metrics-port``)."""
    port = get_settings().metrics_port
    if port is not None:
        from workers import metrics

        metrics.serve(port)


@worker_init.connect(weak=False)
def _start_tracing(**_: object) -> None:
    """OpenTelemetry traces with DUET_OTEL=1 (off by default: nothing imported)."""
    if get_settings().otel:
        from workers import tracing

        tracing.enable_from_environment()


@worker_process_shutdown.connect(weak=False)
def _child_exited(pid: int, **_: object) -> None:
    if get_settings().metrics_port is not None:
        from workers import metrics

        metrics.process_exited(pid)


@after_setup_logger.connect(weak=False)
@after_setup_task_logger.connect(weak=False)
def _redact_logs(logger: logging.Logger, **_: object) -> None:
    """Every line the worker logs is redacted of API keys (tracebacks included)."""
    from workers.secrets import redact_logs

    redact_logs(logger)


@worker_shutdown.connect(weak=False)
def _close_providers(**_: object) -> None:
    from workers.providers import close_providers

    close_providers()
