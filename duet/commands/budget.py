"""``duet budget``: read and set the fleet's budgets (the ledger in Redis)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from duet.commands.support import JsonOpt, connect, emit_json, fails_cleanly, out, plain
from orchestration.core.budget import UNITS, Budget, parse_scope

budget_app = typer.Typer(
    help="Fleet-wide budgets: show what is spent, set limits, reset spending.",
    epilog="Example: duet budget set global:team-a --max-usd 50 && duet budget show global:team-a",
    no_args_is_help=True,
)

ScopeArg = Annotated[
    str,
    typer.Argument(
        help="run:ID, batch:ID, user:ID or global:NAME", show_default=False, metavar="SCOPE"
    ),
]


def _fmt(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if unit == "usd" else f"{value:,.0f}"


@budget_app.command(
    "show", epilog="Example: duet budget show global:team-a   (or: duet budget show user:)"
)
@fails_cleanly
def show(
    scope: Annotated[
        str, typer.Argument(help="A scope, or a prefix such as 'user:'; all when left out.")
    ] = "",
    as_json: JsonOpt = False,
) -> None:
    """Limit, spent, reserved and remaining per unit, for one scope or all that match."""
    connect()
    from orchestration.client.handles import get_budget, list_budgets

    names = [scope] if scope.count(":") == 1 and scope.split(":")[1] else list_budgets(scope)
    if not names and not as_json:
        out.print(plain("no budgets" + (f" matching {scope!r}" if scope else "")))
        return
    for name in names:
        name = _whole_batch_id(name)
        state = get_budget(name)
        if as_json:
            units = {
                unit: {
                    "limit": state.limits.get(unit),
                    "spent": state.spent.value(unit),
                    "reserved": state.reserved.value(unit),
                    "remaining": state.remaining.get(unit),
                    "lapsed": state.lapsed.value(unit),
                }
                for unit in UNITS
            }
            emit_json({"scope": name, "warn_at": state.warn_at, "units": units})
            continue
        table = Table(title=plain(f"{name}  (warn at {state.warn_at:.0%})"), title_justify="left")
        for column in ("unit", "limit", "spent", "reserved", "remaining"):
            table.add_column(column, justify="left" if column == "unit" else "right")
        for unit in UNITS:
            limit = state.limits.get(unit)
            spent, reserved = state.spent.value(unit), state.reserved.value(unit)
            if limit is None and not spent and not reserved:
                continue
            table.add_row(
                unit,
                _fmt(unit, limit),
                _fmt(unit, spent),
                _fmt(unit, reserved),
                _fmt(unit, state.remaining.get(unit)),
            )
        if not table.rows and name.startswith("batch:"):
            _batch_spend(table, name.split(":", 1)[1])
        if state.lapsed.calls:
            table.caption = (
                f"of spent, {state.lapsed.calls} call(s) whose worker died were charged "
                f"their whole hold ({state.lapsed.tokens:,} tokens, "
                f"${state.lapsed.usd:.4f}): the vendor's bill for them is unknown, at most that"
            )
        out.print(table)


def _whole_batch_id(scope: str) -> str:
    """``batch:PREFIX`` (the short id ``duet ls`` shows) as ``batch:WHOLE-ID``."""
    kind, _, typed = scope.partition(":")
    if kind != "batch" or not typed:
        return scope
    from duet.commands import ids

    try:
        return f"batch:{ids.batch_id(typed)}"
    except LookupError:
        return scope


def _batch_spend(table: Table, batch_id: str) -> None:
    """A batch with no budget limit keeps no ledger: its spend is its record's, the number
    ``duet ls`` shows."""
    from orchestration.state import batches, connection

    rec = batches.record(connection.get_redis(), batch_id)
    if rec:
        table.caption = "no limit set: spent is what the batch's runs cost (as duet ls shows)"
        table.add_row("usd", "-", _fmt("usd", float(rec.get("usd") or 0)), "-", "-")


@budget_app.command(
    "set", epilog="Example: duet budget set global:team-a --max-usd 50 --warn-at 0.8"
)
@fails_cleanly
def set_(
    scope: ScopeArg,
    max_input_tokens: Annotated[int | None, typer.Option(help="Input tokens.")] = None,
    max_output_tokens: Annotated[int | None, typer.Option(help="Output tokens.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Input + output tokens.")] = None,
    max_usd: Annotated[float | None, typer.Option(help="US dollars.")] = None,
    max_calls: Annotated[int | None, typer.Option(help="Model calls.")] = None,
    warn_at: Annotated[float, typer.Option(help="Warn past this fraction of a limit.")] = 0.8,
) -> None:
    """Set (replace) a scope's limits; what it has spent is kept."""
    parse_scope(scope)
    from pydantic import ValidationError

    from orchestration.core.errors import ConfigError

    try:
        budget = Budget(
            max_input_tokens=max_input_tokens,
            max_output_tokens=max_output_tokens,
            max_tokens=max_tokens,
            max_usd=max_usd,
            max_calls=max_calls,
            warn_at=warn_at,
        )
    except ValidationError as exc:
        problems = "; ".join(f"--{e['loc'][0]}: {e['msg']}".replace("_", "-") for e in exc.errors())
        raise ConfigError(problems) from None
    connect()
    from orchestration.client.handles import set_budgets

    set_budgets({scope: budget})
    limits = ", ".join(f"{u} {_fmt(u, v)}" for u, v in budget.limits().items()) or "no limits"
    out.print(plain(f"{scope}: {limits}"))


@budget_app.command("reset", epilog="Example: duet budget reset global:team-a")
@fails_cleanly
def reset(scope: ScopeArg) -> None:
    """Zero a scope's spending (its limits stay)."""
    parse_scope(scope)
    connect()
    from orchestration.client.handles import reset_budget

    reset_budget(scope)
    out.print(plain(f"{scope}: spending reset"))
