"""The ``duet`` Typer app: its top-level options (``--version``, ``--log-format``) and
the arguments and options its commands share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from duet.commands.support import (
    OK,
    out,
    use_log_format,
)
from duet.report.records import (
    OUTCOMES,
)
from orchestration.core.errors import ConfigError

app = typer.Typer(
    name="duet",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def flags_take_no_value(command: Any, parent: Any = None) -> Any:
    """``command`` and its subcommands with no type shown after a flag: Typer 0.29 writes
    ``--version <bool>`` in help, as if the flag took a value. (Typer vendors its own
    click, so parameters are told by what they have, not by class.)"""
    ctx = command.context_class(command, parent=parent, **command.context_settings)
    for param in [*command.params, command.get_help_option(ctx)]:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", "") is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        flags_take_no_value(sub, ctx)
    return command


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from duet import DISTRIBUTION

        try:
            out.print(f"duet {version(DISTRIBUTION)}")
        except PackageNotFoundError:  # a source checkout that was never installed
            out.print("duet (not installed)")
        raise typer.Exit(OK)


@app.callback(
    epilog="Example: duet run examples/review.toml --input examples/inputs.jsonl "
    "--output results.jsonl"
)
def _duet(
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            help="Messages on stderr as `text` or `json` (one JSON object per line with the "
            "batch and run ids; passed on to `duet worker`). Default: DUET_LOG_FORMAT or text.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Review many inputs with an actor model and a critic model, on a Celery fleet.

    Without DUET_REDIS_URL, `duet run` starts an embedded Redis and an in-process
    worker; with it, every command works against that cluster.
    """
    chosen = log_format or os.environ.get("DUET_LOG_FORMAT") or "text"
    if chosen not in ("text", "json"):
        raise typer.BadParameter(f"{chosen!r}: choose text or json", param_hint="--log-format")
    use_log_format(chosen)


ConfigArg = Annotated[
    Path,
    typer.Argument(help="Review config (TOML).", exists=True, dir_okay=False, show_default=False),
]


InputOpt = Annotated[
    Path,
    typer.Option(
        "--input",
        "-i",
        exists=True,
        show_default=False,
        help="Inputs: a JSONL file, a CSV file, or a directory (one input per file).",
    ),
]


IncludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--include",
        metavar="GLOB",
        help="Directory input: read only files matching this glob (repeat for more), e.g. '*.py'.",
    ),
]


IncludeSecretsOpt = Annotated[
    bool,
    typer.Option(
        "--include-secrets",
        help="Send files holding keys or credentials to the models too (by default they "
        "are skipped and counted: detect-secrets finds them).",
    ),
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude",
        metavar="GLOB",
        help="Directory or --git input: leave out files or folders matching this glob "
        "(repeatable; adds to [inputs] exclude).",
    ),
]


StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Refuse the whole batch (exit 2) if any input is bad, listing every one.",
    ),
]


CacheOpt = Annotated[
    bool,
    typer.Option(
        "--cache",
        help="Serve repeated model calls from the model-call cache (answers up to 7 days "
        "old, or --cache-ttl); a hit costs no budget and no vendor request. `duet run` also "
        "serves inputs whose run finished before whole, starting nothing. docs/cache.md.",
    ),
]
CacheTtlOpt = Annotated[
    str | None,
    typer.Option(
        "--cache-ttl",
        metavar="TTL",
        help="Turn the cache on, serving answers up to TTL old (7d, 12h, seconds).",
    ),
]


MaxInFlightOpt = Annotated[
    int | None,
    typer.Option(
        "--max-in-flight",
        min=1,
        metavar="N",
        help="At most N runs of the batch started and not finished at any moment, across "
        "the whole fleet (over the config's [batch] max_in_flight). docs/running-at-scale.md.",
    ),
]


VendorBatchOpt = Annotated[
    bool,
    typer.Option(
        "--vendor-batch",
        help="Send both agents' calls through the vendors' batch APIs (OpenAI Batch, "
        "Anthropic Message Batches): about half the price, answers within the vendors' "
        "window (up to 24 h); each round of the batch goes out together.",
    ),
]


LogEveryOpt = Annotated[
    float,
    typer.Option(
        "--log-every",
        min=0.1,
        metavar="SECONDS",
        help="When stderr is not a terminal: one progress line every SECONDS.",
    ),
]


StatusOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--status",
        metavar="STATUS",
        help="Only records with this status (repeatable): approved, max_rounds_reached, "
        "interrupted, failed, cancelled, rejected.",
    ),
]


BatchArg = Annotated[
    str,
    typer.Argument(
        help="Batch id (printed by `duet submit`), or a unique prefix of it.", show_default=False
    ),
]


RunArg = Annotated[
    str,
    typer.Argument(
        help="Run id (the run_id field of a result), or a unique prefix of it.",
        show_default=False,
    ),
]


TimeoutOpt = Annotated[
    float | None, typer.Option("--timeout", help="Give up after this many seconds (exit 1).")
]


def check_status(status: list[str] | None) -> None:
    unknown = sorted(set(status or ()) - set(OUTCOMES))
    if unknown:
        raise ConfigError(
            f"--status: unknown status {', '.join(unknown)}; choose from {', '.join(OUTCOMES)}"
        )
