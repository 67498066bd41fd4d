"""``duet worker``, ``duet sweep``, ``duet metrics`` and ``duet fake-llm``: the processes a
fleet runs beside the batches (a worker pool, the sweeper, the fleet's metrics, the local
stand-in for the vendors' APIs)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Annotated

import typer

from duet.commands.app import app
from duet.commands.support import (
    INTERRUPTED,
    connect,
    current_log_format,
    err,
    fails_cleanly,
    note,
    out,
    plain,
)
from orchestration.core.errors import ConfigError
from orchestration.settings import get_settings

if TYPE_CHECKING:
    from orchestration.services.coordinator import Dispatch
    from orchestration.services.sweeper import Transition


@app.command(
    epilog="Example: DUET_REDIS_URL=redis://localhost:6379/0 duet worker --queues actor,critic --concurrency 200"
)
@fails_cleanly
def worker(
    queues: Annotated[
        str, typer.Option("--queues", "-Q", help="Comma-separated queues to consume.")
    ] = "actor,critic,coordinator,tools",
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            help="Calls in flight (threads). Default: DUET_WORKER_CONCURRENCY.",
        ),
    ] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="Celery log level.")] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="Serve Prometheus metrics on this port (/metrics). Default: DUET_METRICS_PORT.",
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            help="Worker log lines as `text` or `json` (with run, batch, step and task ids). "
            "Default: `duet --log-format`, DUET_LOG_FORMAT or text.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Become a Celery worker (threads pool, task events on) for the cluster in DUET_REDIS_URL."""
    from orchestration.state import keys
    from orchestration.state.connection import is_redis_url
    from orchestration.state.preflight import check_scheme
    from workers.app import check_cluster, check_visibility_timeout

    settings = get_settings()
    check_cluster(settings.broker_url or settings.redis_url)  # one-line refusals, before Celery
    for variable, url in (
        ("DUET_REDIS_URL", settings.redis_url),
        ("DUET_BROKER_URL", settings.broker_url),
    ):
        if url and (variable == "DUET_REDIS_URL" or is_redis_url(url)):
            check_scheme(url, variable)
    check_visibility_timeout()
    chosen = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = sorted(set(chosen) - set(keys.ALL_QUEUES))
    if not chosen or unknown:
        raise ConfigError(
            f"--queues: unknown queue(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(keys.ALL_QUEUES)}"
        )
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(concurrency or get_settings().worker_concurrency),
        "-E",
        "-Q",
        ",".join(chosen),
        "--loglevel",
        loglevel,
        "--hostname",
        f"duet-{os.getpid()}@%h",
    ]
    if metrics_port is not None:
        os.environ["DUET_METRICS_PORT"] = str(metrics_port)
    if log_format not in (None, "text", "json"):
        raise ConfigError(f"--log-format {log_format!r}: choose text or json")
    os.environ["DUET_LOG_FORMAT"] = log_format or current_log_format()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)  # this process becomes the worker: signals go straight to it


@app.command(
    epilog="Example: DUET_REDIS_URL=redis://localhost:6379/0 duet sweep --every 30 --after 600"
)
@fails_cleanly
def sweep(
    every: Annotated[
        float | None,
        typer.Option(
            "--every",
            min=0.1,
            help="Keep sweeping, every this many seconds, until SIGTERM or Ctrl-C (taking "
            "turns with the workers' sweeps). Default: sweep once and exit.",
            show_default=False,
        ),
    ] = None,
    after: Annotated[
        float | None,
        typer.Option(
            "--after",
            min=0.1,
            help="Send on unfinished runs that have not moved for this many seconds (and "
            "have no live call). Default: DUET_SWEEP_AFTER_S.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Send on the runs that stopped moving: the coordinator's transition, or the step
    again (what every worker's periodic sweep does; sending twice is harmless)."""
    from workers import sweep as sweeper

    connect()
    after_s = get_settings().sweep_after_s if after is None else after
    if every is None:
        sends = sweeper.sweep_once(None, after_s=after_s) or []
        _print_sends(sends)
        out.print(plain(f"swept: {len(sends)} run(s) sent on (stale after {after_s:g} s)"))
        return
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    note(f"sweeping every {every:g} s, runs stale after {after_s:g} s (SIGTERM or Ctrl-C stops)")
    sweeper.sweep_every(
        sweeper.holder_id(), stop, interval_s=every, after_s=after_s, sent=_print_sends
    )
    note("sweeper stopped")


def _print_sends(sends: list[Dispatch | Transition]) -> None:
    """One line per run sent on (ids escaped: they are user data)."""
    from orchestration.services.sweeper import Transition

    for send in sends:
        what = f"transition {send.seq}" if isinstance(send, Transition) else f"step {send.step_key}"
        batch = f" (batch {send.batch_id})" if send.batch_id else ""
        out.print(plain(f"sent on run {send.run_id}{batch}: {what}"), soft_wrap=True)
    if sends:
        sys.stdout.flush()


@app.command(epilog="Example: DUET_REDIS_URL=redis://localhost:6379/0 duet metrics --port 9809")
@fails_cleanly
def metrics(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to serve /metrics on.")] = 9809,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",  # noqa: S104
) -> None:
    """Serve the fleet's figures from Redis for Prometheus: queue depth, runs and batches
    in flight, budgets per scope (one scrape target; workers serve their own figures)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import start_http_server

    from duet.commands.exporter import FleetCollector
    from orchestration.state.connection import client_for, get_redis, is_redis_url

    connect()
    settings = get_settings()
    broker_url = settings.broker_url or settings.redis_url or ""
    broker = None
    if is_redis_url(broker_url):
        broker = client_for(
            broker_url,
            socket_timeout=settings.redis_socket_timeout_s,
            socket_connect_timeout=settings.redis_connect_timeout_s,
        )
    registry = CollectorRegistry()
    registry.register(FleetCollector(get_redis(), broker))
    try:
        server, _ = start_http_server(port, host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"--port {port}: cannot listen on {host}: {exc}") from exc
    err.print(f"serving the fleet's metrics on http://{host}:{port}/metrics (Ctrl-C stops)")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
        raise typer.Exit(INTERRUPTED) from None


@app.command("fake-llm", epilog="Example: duet fake-llm --port 8765 --latency-ms 50 --rpm 600")
@fails_cleanly
def fake_llm(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    latency_ms: Annotated[float, typer.Option(help="Delay added to every answer.")] = 0.0,
    rpm: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Requests a minute, enforced per second as vendors may (429 with "
            "retry-after over it); stated in the vendors' rate-limit headers.",
        ),
    ] = None,
    tpm: Annotated[
        int | None, typer.Option(min=1, help="Tokens a minute, enforced the same way.")
    ] = None,
) -> None:
    """Serve a local stand-in for the OpenAI and Anthropic APIs (answers as the sim model)."""
    import importlib.util

    from workers.providers.sdk import install_hint

    missing = [sdk for sdk in ("openai", "anthropic") if importlib.util.find_spec(sdk) is None]
    if missing:
        raise ConfigError(
            "the stand-in checks every request against the vendors' SDK types: "
            + install_hint(",".join(missing))
        )
    from duet.standin.server import serve

    serve(host, port, latency_ms, rpm, tpm)
