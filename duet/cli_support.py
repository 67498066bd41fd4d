"""What every ``duet`` command shares: consoles, exit codes, errors, the connection."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from orchestration.core.errors import ConfigError
from orchestration.settings import get_settings

#: Exit codes.
OK, SOME_FAILED, BAD_USAGE, INTERRUPTED = 0, 1, 2, 130

out = Console()
err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def fails_cleanly(command: F) -> F:
    """Turn the mistakes a user can fix into a one-line message and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Settings are read once per process; each command starts from the environment
        # it was given (this matters when many commands run in one test process).
        get_settings.cache_clear()
        try:
            return command(*args, **kwargs)
        except (ConfigError, LookupError) as exc:
            if isinstance(exc, KeyError | IndexError):
                raise  # a bug, not a batch or run that is not there
            error(str(exc))
            raise typer.Exit(BAD_USAGE) from None

    return wrapper  # type: ignore[return-value]


def error(message: str) -> None:
    # soft_wrap: a long path or key path stays on one line, whole, for copy and grep.
    err.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)


def warn(message: str) -> None:
    err.print(Text("warning: " + message, style="yellow"), soft_wrap=True)


def connect(*, embedded_ok: bool = False) -> str:
    """Point this process at the cluster, or start the embedded one; the Redis URL.

    Raises:
        ConfigError: no DUET_REDIS_URL and the command cannot use an embedded cluster.
    """
    from duet import local
    from orchestration.state import connection

    url = get_settings().redis_url
    if url:
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
