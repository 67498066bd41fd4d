"""What every ``duet`` command shares: consoles, exit codes, errors, the connection, and
how untrusted text (ids, prompts, metadata, model output) is made safe to print."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import redis
import typer
from kombu.exceptions import OperationalError
from rich.console import Console
from rich.measure import Measurement
from rich.text import Text

from orchestration.core.errors import ConfigError
from orchestration.logjson import JsonFormatter, escape_unsafe, json_line
from orchestration.settings import get_settings
from orchestration.state.connection import (
    UNAVAILABLE_ERRORS,
    Unreachable,
    check_broker_reachable,
    check_reachable,
    first_line,
    is_redis_url,
    unreachable,
)
from orchestration.state.preflight import check_scheme, check_server

#: Exit codes.
OK, SOME_FAILED, BAD_USAGE, INTERRUPTED = 0, 1, 2, 130

out = Console()
err = Console(stderr=True)

#: ``--json`` on every command that reads state: JSON lines on stdout instead of a table.
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json", help="One JSON object per line on stdout (whole ids, raw numbers), no table."
    ),
]


def emit_json(data: Mapping[str, Any]) -> None:
    """One JSON object as a line on stdout, every character a terminal acts on escaped."""
    sys.stdout.write(json_line(dict(data)) + "\n")
    sys.stdout.flush()


F = TypeVar("F", bound=Callable[..., Any])

#: Messages on stderr as JSON log lines (``duet --log-format json``) instead of text.
_json_logs = False
log = logging.getLogger("duet")


def clean(value: object) -> str:
    """``value`` as text a terminal shows as is: control characters (ESC, CR, BEL, the C1
    CSI...) become visible escapes such as ``\\x1b`` (:func:`escape_unsafe`). Newlines
    and tabs are kept."""
    return escape_unsafe(str(value))


def plain(value: object, style: str = "") -> Text:
    """Untrusted text for Rich: never read as markup (``[link=...]``, ``[/b]``), and
    :func:`clean` of control characters."""
    return Text(clean(value), style=style)


def print_whole(renderable: Any, console: Console | None = None) -> None:
    """Print a table (on stdout, or ``console``) at the width it needs, so no id, count or
    reason is cut with an ellipsis to fit the terminal (a wider line wraps on screen)."""
    console = console or out
    needed = Measurement.get(console, console.options.update_width(1000), renderable).maximum
    if needed <= console.width:
        console.print(renderable)
        return
    wide = Console(
        file=console.file,
        width=needed,
        force_terminal=console.is_terminal or None,
        stderr=console.stderr,
    )
    wide.print(renderable)


def fails_cleanly(command: F) -> F:
    """Turn the mistakes a user can fix into a one-line message and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Settings are read once per process; each command starts from the environment
        # it was given (this matters when many commands run in one test process).
        get_settings.cache_clear()
        try:
            return command(*args, **kwargs)
        except (ConfigError, LookupError, Unreachable) as exc:
            if isinstance(exc, KeyError | IndexError):
                raise  # a bug, not a batch or run that is not there
            error(str(exc))
            raise typer.Exit(BAD_USAGE) from None
        except UNAVAILABLE as exc:
            # Redis or the broker went away (or froze) after the command connected.
            error(str(_lost(exc)))
            raise typer.Exit(BAD_USAGE) from None

    return wrapper  # type: ignore[return-value]


#: The loggers of Duet's own code, which the JSON mode takes over.
OWN_LOGGERS = ("duet", "orchestration", "workers")


class _JsonLines(logging.StreamHandler):  # type: ignore[type-arg]
    """JSON lines on the stderr of the moment (a test runner swaps it per command)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def use_log_format(log_format: str) -> None:
    """``text`` (messages for a person; logging as Python sets it up) or ``json`` (one
    JSON log line per message, with the ids it concerns, for a log pipeline: Duet's own
    loggers write them on stderr at INFO and up)."""
    global _json_logs
    _json_logs = log_format == "json"
    for name in OWN_LOGGERS:
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if isinstance(h, _JsonLines)]:
            logger.removeHandler(handler)
        if _json_logs:
            logger.addHandler(_JsonLines())
            logger.setLevel(logging.INFO)
            logger.propagate = False
        else:
            logger.setLevel(logging.NOTSET)
            logger.propagate = True


def current_log_format() -> str:
    return "json" if _json_logs else "text"


def record(message: str, **ids: Any) -> None:
    """A JSON log line about a batch or run (``batch_id=...``); nothing in text mode,
    where the screen already says it."""
    if _json_logs:
        log.info(message, extra=ids)


#: Redis or broker errors that mean "not usable now" (down, frozen, refusing, full, a
#: replica), as opposed to a bug (a script error keeps its traceback).
UNAVAILABLE: tuple[type[BaseException], ...] = (*UNAVAILABLE_ERRORS, OperationalError)


def _lost(exc: BaseException) -> Unreachable:
    """The one-line error for Redis or the broker failing mid-command."""
    settings = get_settings()
    if isinstance(exc, OperationalError) and settings.broker_url:
        return unreachable(settings.broker_url, "DUET_BROKER_URL", exc, what="the broker")
    if settings.redis_url:
        return unreachable(settings.redis_url, "DUET_REDIS_URL", exc)
    return Unreachable(f"lost the embedded Redis: {first_line(exc)}")


def error(message: str) -> None:
    if _json_logs:
        log.error(message)
        return
    # soft_wrap: a long path or key path stays on one line, whole, for copy and grep.
    err.print(Text("error: ", style="bold red") + plain(message), soft_wrap=True)


def warn(message: str) -> None:
    if _json_logs:
        log.warning(message)
        return
    err.print(plain("warning: " + message, style="yellow"), soft_wrap=True)


def note(message: str) -> None:
    """A line of plain (untrusted-safe) text on stderr."""
    if _json_logs:
        log.info(message)
        return
    err.print(plain(message), soft_wrap=True)


def connect(*, embedded_ok: bool = False) -> str:
    """Point this process at the cluster, or start the embedded one; the Redis URL.

    Raises:
        ConfigError: no DUET_REDIS_URL and the command cannot use an embedded cluster.
    """
    from duet.embedded import local
    from orchestration.state import connection

    settings = get_settings()
    url = settings.redis_url
    if url:
        # One quick PING each: a dead, frozen or refusing server is one line, in seconds;
        # then the server is checked for what Duet needs (preflight: one line, exit 2).
        check_scheme(url, "DUET_REDIS_URL")
        check_reachable(url, "DUET_REDIS_URL")
        servers = [(url, "DUET_REDIS_URL")]
        broker = settings.broker_url
        if broker and broker != url:
            if is_redis_url(broker):
                check_reachable(broker, "DUET_BROKER_URL")
                servers.append((broker, "DUET_BROKER_URL"))
            else:
                check_broker_reachable(broker, "DUET_BROKER_URL")
        for server, variable in servers:
            try:
                for warning in check_server(server, variable):
                    warn(warning)
            except (redis.RedisError, OSError) as exc:
                raise unreachable(server, variable, exc) from None
        connection.use_redis(url)
        return url
    if not embedded_ok:
        raise ConfigError(
            "this command needs a cluster: set DUET_REDIS_URL (e.g. redis://localhost:6379/0). "
            "An embedded cluster would stop when the command ends; `duet run` uses one."
        )
    with err.status("No DUET_REDIS_URL: starting an embedded Redis and an in-process worker"):
        url = local.ensure_backend()
    connection.use_redis(url)  # the cluster may have been started earlier in this process
    return url
