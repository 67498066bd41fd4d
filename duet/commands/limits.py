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
    """Every limit: configured (and by whom), learned from the vendor's headers (and
    when), the rate paced at, and the slots booked now."""
    connect()
    import time

    from orchestration.core.ratelimit import effective
    from orchestration.state import connection
    from orchestration.state.ratelimits import limit_names, limit_state, stored_rate_limits

    r = connection.get_redis()
    configured = stored_rate_limits(r)
    names = limit_names(r)
    table = Table(title="Fleet rate limits", title_justify="left")
    for column in ("limit", "configured", "learned", "paced at", "now", "set by"):
        table.add_column(column, no_wrap=column not in ("set by", "limit"))
    now = time.time()
    rows = 0
    for name in names:
        limit = configured.get(name)
        state = limit_state(r, name)
        stated = state.learned_rpm or state.learned_tpm
        if limit is None and not (stated or state.permits or state.paused_s):
            continue  # a vendor that states no limit, nothing held: nothing paces it
        rows += 1
        per = 60.0 / limit.window_s if limit else 1.0
        rpm = round(limit.rpm * per) if limit and limit.rpm else None
        tpm = round(limit.tpm * per) if limit and limit.tpm else None
        if as_json:
            emit_json(
                {
                    "model": name,
                    "rpm": limit.rpm if limit else None,
                    "tpm": limit.tpm if limit else None,
                    "window_s": limit.window_s if limit else None,
                    "set_by": limit.source if limit else None,
                    "learned_rpm": state.learned_rpm,
                    "learned_tpm": state.learned_tpm,
                    "learned_at": state.learned_at,
                    "paced_rpm": effective(rpm, state.learned_rpm),
                    "paced_tpm": effective(tpm, state.learned_tpm),
                    "permits": state.permits,
                    "next_slot_s": state.next_slot_s,
                    "paused_s": state.paused_s,
                }
            )
            continue
        learned = "-"
        if state.learned_at is not None:
            said = _describe_rates(state.learned_rpm, state.learned_tpm) or "no limits sent"
            learned = f"{said} ({max(now - state.learned_at, 0):.0f}s ago)"
        paced = _describe_rates(
            effective(rpm, state.learned_rpm), effective(tpm, state.learned_tpm)
        )
        used = f"{state.permits:,} booked"
        if state.next_slot_s > 0:
            used += f", next slot in {state.next_slot_s:.1f}s"
        if state.paused_s > 0:
            used += f"; paused by the vendor {state.paused_s:.0f}s"
        table.add_row(
            plain(name),
            _describe(limit) if limit else "-",
            learned,
            paced or "-",
            used,
            plain(limit.source or "-") if limit else "-",
        )
    if as_json:
        return
    if not rows:
        out.print("no rate limits: every model runs as fast as the workers and vendors allow")
        return
    print_whole(table)


def _describe_rates(rpm: int | None, tpm: int | None) -> str:
    parts = [f"{rpm:,} rpm" if rpm else "", f"{tpm:,} tpm" if tpm else ""]
    return ", ".join(p for p in parts if p)


@limits_app.command("set", epilog="Example: duet limits set gpt-4o --rpm 500 --tpm 200000")
@fails_cleanly
def set_(
    model: ModelArg,
    rpm: Annotated[int | None, typer.Option("--rpm", min=1, help="Requests per window.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=1, help="Tokens per window.")] = None,
    window_s: Annotated[
        float, typer.Option("--window", min=0.001, help="Window length, seconds.")
    ] = 60.0,
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            help="The endpoint the limit is for, as agents name it (default: the vendor's own).",
        ),
    ] = None,
) -> None:
    """Set (replace) one model's limit on one endpoint for the whole fleet."""
    from orchestration.core.errors import ConfigError
    from orchestration.state.ratelimits import RateLimit, rate_key

    if rpm is None and tpm is None:
        raise ConfigError("give --rpm, --tpm or both (duet limits clear removes a limit)")
    name = rate_key(model, base_url)
    connect()
    from orchestration.state import connection
    from orchestration.state.ratelimits import set_rate_limits

    limit = RateLimit(rpm=rpm, tpm=tpm, window_s=window_s, source="duet limits set")
    set_rate_limits(connection.get_redis(), {model: limit}, base_url)
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
