"""Budgets as data: limits per scope, amounts that add up, and pure checks.

A *scope* is a string naming who a budget belongs to: ``run:<id>``, ``batch:<id>``,
``user:<id>``, ``global:<name>``, or one agent within one run, ``actor:<run id>`` /
``critic:<run id>`` (an agent's own ``budget=``). Every model call is charged to several
scopes at once (its run, its agent in the run, its batch, its user, the fleet). This
module holds no I/O; the atomic Redis side (reservations, settlement, rate limits) lives
in :mod:`orchestration.state.budgets`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.errors import ConfigError

if TYPE_CHECKING:
    from orchestration.core.usage import Usage

# --- units ------------------------------------------------------------------
INPUT_TOKENS: Final = "input_tokens"
OUTPUT_TOKENS: Final = "output_tokens"
TOKENS: Final = "tokens"
USD: Final = "usd"
CALLS: Final = "calls"
#: Every unit, in the order checks report them.
UNITS: Final = (INPUT_TOKENS, OUTPUT_TOKENS, TOKENS, USD, CALLS)

# --- scopes -----------------------------------------------------------------
#: The kinds of scope one role's calls alone are charged to: ``actor:<run id>``...
ROLE_KINDS: Final = ("actor", "critic")
#: ...and those every call of a run is charged to.
SHARED_KINDS: Final = ("run", "batch", "user", "global")
SCOPE_KINDS: Final = (*SHARED_KINDS, *ROLE_KINDS)
# No ':' in the name (keeps a scope's Redis keys apart from another scope's suffixed
# keys), no ',' (run records list scopes comma-separated), no whitespace, no braces
# (Redis Cluster hash tags).
_SCOPE_NAME = re.compile(r"^[^\s:,{}]+$")


def scope(kind: str, name: str) -> str:
    """Build a scope string such as ``run:abc`` or ``global:default``.

    Raises:
        ConfigError: unknown kind, or a name that is empty or holds ``:``, ``,``, braces
            or spaces.
    """
    if kind not in SCOPE_KINDS:
        raise ConfigError(f"unknown budget scope kind {kind!r}; expected one of {SCOPE_KINDS}")
    if not isinstance(name, str) or not _SCOPE_NAME.match(name):
        raise ConfigError(
            f"bad budget scope name {name!r}: must be non-empty, without ':', ',', braces or spaces"
        )
    return f"{kind}:{name}"


def parse_scope(value: str) -> tuple[str, str]:
    """Split and validate a scope string into ``(kind, name)``.

    Raises:
        ConfigError: the string is not ``<kind>:<name>`` with a known kind and a valid name.
    """
    kind, sep, name = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not sep:
        raise ConfigError(f"bad budget scope {value!r}: expected '<kind>:<name>', e.g. 'run:abc'")
    scope(kind, name)
    return kind, name


def scopes_for(
    *,
    run_id: str | None = None,
    batch_id: str | None = None,
    user_id: str | None = None,
    global_name: str | None = "default",
) -> list[str]:
    """The scopes one call is charged to, narrowest first (``None`` leaves one out)."""
    pairs = (("run", run_id), ("batch", batch_id), ("user", user_id), ("global", global_name))
    return [scope(kind, name) for kind, name in pairs if name is not None]


def role_scopes(scopes: Iterable[str], role: str) -> tuple[str, ...]:
    """The scopes a call of ``role`` is charged to: every one of the run's scopes but the
    other role's (``critic:<run id>`` caps the critic's calls only)."""
    return tuple(s for s in scopes if s.partition(":")[0] in (role, *SHARED_KINDS))


def reason_for(scope_: str, unit: str) -> str:
    """Interruption reason for a run stopped by a budget: ``budget:<scope_kind>:<unit>``."""
    kind, _ = parse_scope(scope_)
    if unit not in UNITS:
        raise ConfigError(f"unknown budget unit {unit!r}; expected one of {UNITS}")
    return f"budget:{kind}:{unit}"


# --- values -----------------------------------------------------------------
class Amount(BaseModel):
    """What a call costs or a scope holds: tokens, dollars and calls, all >= 0."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    usd: float = Field(default=0.0, ge=0)
    calls: int = Field(default=0, ge=0)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def value(self, unit: str) -> float:
        """The amount in one unit (``tokens`` is input plus output)."""
        amounts: dict[str, float] = {
            INPUT_TOKENS: self.input_tokens,
            OUTPUT_TOKENS: self.output_tokens,
            TOKENS: self.tokens,
            USD: self.usd,
            CALLS: self.calls,
        }
        if unit not in amounts:
            raise ConfigError(f"unknown budget unit {unit!r}; expected one of {UNITS}")
        return amounts[unit]

    def __add__(self, other: Amount) -> Amount:
        return Amount(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            usd=round(self.usd + other.usd, 10),
            calls=self.calls + other.calls,
        )

    @classmethod
    def from_usage(cls, usage: Usage) -> Amount:
        """The budget amount of a recorded :class:`~orchestration.core.usage.Usage`."""
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            usd=usage.usd,
            calls=usage.calls,
        )


ZERO: Final = Amount()


class Budget(BaseModel):
    """Limits of one scope. Every limit is optional: ``None`` turns it off."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_input_tokens: int | None = Field(default=None, ge=0)
    """Most input (prompt) tokens the scope may use."""
    max_output_tokens: int | None = Field(default=None, ge=0)
    """Most output (completion) tokens the scope may use."""
    max_tokens: int | None = Field(default=None, ge=0)
    """Most input plus output tokens the scope may use."""
    max_usd: float | None = Field(default=None, ge=0)
    """Most US dollars the scope may spend."""
    max_calls: int | None = Field(default=None, ge=0)
    """Most model calls the scope may make."""
    warn_at: float = Field(default=0.8, gt=0, le=1)
    """Fraction of a limit past which a one-time warning is emitted."""

    def limits(self) -> dict[str, float]:
        """The limits that are on, by unit, in :data:`UNITS` order."""
        values = {unit: getattr(self, f"max_{unit}") for unit in UNITS}
        return {unit: v for unit, v in values.items() if v is not None}

    def check(self, spent: Amount, reserved: Amount = ZERO, extra: Amount = ZERO) -> str | None:
        """First unit that ``spent + reserved + extra`` would take past its limit, or ``None``.

        Reaching a limit exactly is allowed; going one past it is not.
        """
        for unit, limit in self.limits().items():
            if spent.value(unit) + reserved.value(unit) + extra.value(unit) > limit:
                return unit
        return None

    def exhausted_unit(self, spent: Amount) -> str | None:
        """First unit whose limit ``spent`` has reached (no room for another call), or ``None``."""
        for unit, limit in self.limits().items():
            if spent.value(unit) >= limit:
                return unit
        return None

    def warning_units(self, spent: Amount) -> list[str]:
        """Units where ``spent`` has reached ``warn_at`` of the limit."""
        return [
            unit
            for unit, limit in self.limits().items()
            if spent.value(unit) >= self.warn_at * limit
        ]


class BudgetWarning(NamedTuple):
    """A scope's unit went past its warning threshold (reported once, fleet-wide)."""

    scope: str
    unit: str
    fraction: float


@dataclass(frozen=True)
class BudgetStatus:
    """Result of the budget check before a round.

    Attributes:
        blocked: ``(scope, unit)`` of the first exhausted limit, or ``None`` to go on.
        warnings: thresholds crossed for the first time (each reported only once ever).
    """

    blocked: tuple[str, str] | None = None
    warnings: list[BudgetWarning] = field(default_factory=list)

    @property
    def reason(self) -> str | None:
        """The run's interruption reason when blocked, e.g. ``budget:global:usd``."""
        return reason_for(*self.blocked) if self.blocked else None


@dataclass(frozen=True)
class Refusal:
    """Why a reservation was refused (nothing was reserved in any scope).

    Attributes:
        scope: the first scope without room.
        unit: the unit that would go past its limit there.
        limit: that limit.
        spent: already spent in the scope, in that unit.
        reserved: held by other in-flight calls, in that unit.
        requested: what this call asked for, in that unit.
    """

    scope: str
    unit: str
    limit: float
    spent: float
    reserved: float
    requested: float

    @property
    def exhausted(self) -> bool:
        """True when waiting cannot help: even with no other call in flight it would not fit.

        When False, room is held by in-flight calls; retry after they settle or expire.
        """
        return self.spent + self.requested > self.limit

    @property
    def reason(self) -> str:
        """The run's interruption reason, e.g. ``budget:run:tokens``."""
        return reason_for(self.scope, self.unit)
