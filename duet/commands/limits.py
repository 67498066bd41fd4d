"""``duet limits``: the fleet's rate limits per model, which outlive the batch that set them."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from duet.commands.support import (
    JsonOpt,
    connect,
    emit_json,
    fails_cleanly,
    out,
    plain,
    print_whole,
)

limits_app = typer.Typer(
    help="Fleet-wide rate limits per model: show, set, clear. They stay in Redis until "
    "cleared, whatever later configs say.",
    epilog="Example: duet limits set gpt-4o --rpm 500 --tpm 200000 && duet limits show",
    no_args_is_help=True,
)

ModelArg = Annotated[
    str, typer.Argument(help="A model as configs name it: gpt-4o, anthropic:claude-opus-4-7…")
]


@limits_app.command("show", epilog="Example: duet limits show")
@fails_cleanly
def show(as_json: JsonOpt = False) -> None:
    """Every model's limit, who set it, and what the fleet used of its window just now."""
    connect()
    from orchestration.state import connection
    from orchestration.state.ratelimits import stored_rate_limits, window_use

    r = connection.get_redis()
    limits = stored_rate_limits(r)
    if as_json:
        for name, limit in sorted(limits.items()):
            provider, model = name.split(":", 1)
            requests, tokens, paused_s = window_use(r, provider, model, limit.window_s)
            emit_json(
                {
                    "model": name,
                    "rpm": limit.rpm,
                    "tpm": limit.tpm,
                    "window_s": limit.window_s,
                    "used_requests": requests,
                    "used_tokens": tokens,
                    "paused_s": paused_s,
                    "set_by": limit.source,
                }
            )
        return
    if not limits:
        out.print("no rate limits: every model runs as fast as the workers and vendors allow")
        return
    table = Table(title="Fleet rate limits", title_justify="left")
    for column in ("model", "requests", "tokens", "window", "used now", "set by"):
        table.add_column(column, no_wrap=column != "set by")
    for name, limit in sorted(limits.items()):
        provider, model = name.split(":", 1)
        requests, tokens, paused_s = window_use(r, provider, model, limit.window_s)
        used = f"{requests:,} requests, {tokens:,} tokens"
        if paused_s > 0:
            used += f"; paused by the vendor {paused_s:.0f}s"
        table.add_row(
            plain(name),
            f"{limit.rpm:,}" if limit.rpm else "-",
            f"{limit.tpm:,}" if limit.tpm else "-",
            f"{limit.window_s:g}s",
            used,
            plain(limit.source or "-"),
        )
    print_whole(table)


@limits_app.command("set", epilog="Example: duet limits set gpt-4o --rpm 500 --tpm 200000")
@fails_cleanly
def set_(
    model: ModelArg,
    rpm: Annotated[int | None, typer.Option("--rpm", min=1, help="Requests per window.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=1, help="Tokens per window.")] = None,
    window_s: Annotated[
        float, typer.Option("--window", min=0.001, help="Window length, seconds.")
    ] = 60.0,
) -> None:
    """Set (replace) one model's limit for the whole fleet."""
    from orchestration.core.errors import ConfigError
    from orchestration.state.ratelimits import RateLimit, rate_key

    if rpm is None and tpm is None:
        raise ConfigError("give --rpm, --tpm or both (duet limits clear removes a limit)")
    name = rate_key(model)
    connect()
    from orchestration.state import connection
    from orchestration.state.ratelimits import set_rate_limits

    limit = RateLimit(rpm=rpm, tpm=tpm, window_s=window_s, source="duet limits set")
    set_rate_limits(connection.get_redis(), {model: limit})
    out.print(plain(f"{name}: {_describe(limit)}"))


@limits_app.command(
    "clear", epilog="Example: duet limits clear gpt-4o   (or every limit: duet limits clear)"
)
@fails_cleanly
def clear(
    models: Annotated[
        list[str] | None, typer.Argument(help="Models to clear; every limit when left out.")
    ] = None,
) -> None:
    """Remove limits: of the models named, or all of them."""
    connect()
    from orchestration.state import connection
    from orchestration.state.ratelimits import clear_rate_limits

    removed = clear_rate_limits(connection.get_redis(), models or None)
    out.print(plain(f"cleared {removed} rate limit(s)"))


def _describe(limit: object) -> str:
    rpm, tpm, window = (getattr(limit, a) for a in ("rpm", "tpm", "window_s"))
    parts = [f"{rpm:,} requests" if rpm else "", f"{tpm:,} tokens" if tpm else ""]
    return " and ".join(p for p in parts if p) + f" per {window:g}s"
