"""Fleet-wide budgets: the atomic Redis side of :mod:`orchestration.core.budget`.

Every operation is one Lua script (``lua/budget_*.lua``; one round trip, EVALSHA after
the first call), so
any number of workers on any number of machines share one hard cap:

- :meth:`BudgetLedger.reserve` holds a call's worst case in every scope of the call
  before the call is made, or holds nothing and says which limit was in the way;
- :meth:`BudgetLedger.settle` swaps the hold for the real usage, once per step;
- a worker renews the holds of its calls in flight; a hold whose lease runs out (its
  worker died mid-call, or the call outlived its lease) is *charged*, not released: the
  call's outcome is unknown and the vendor may have billed it, so the cap stays a cap on
  the bill.

Per scope Redis keeps (see :mod:`orchestration.state.keys`): a hash of limits and counters
(``limit:<unit>``, ``spent:<unit>``, ``reserved:<unit>``, ``warn_at``, ``warned:<unit>``),
a sorted set of open holds scored by lease expiry (ms, server clock), and a hash of the
amount of each open hold so it is released exactly. Dollars are stored as integer
micro-dollars so Lua adds them exactly; charges round up, limits round down.

All clocks are the Redis server's (``TIME``), never the caller's.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import redis

from orchestration.core.budget import (
    UNITS,
    USD,
    ZERO,
    Amount,
    Budget,
    BudgetStatus,
    BudgetWarning,
    Refusal,
    parse_scope,
)
from orchestration.core.errors import ConfigError, DuetError
from orchestration.defaults import DEFAULT_FINISHED_TTL_S
from orchestration.state import keys, replicas, scripts
from orchestration.state.scripts import ScriptCall

#: Seconds a settled-step marker lives (a redelivered step is charged once within it).
DEFAULT_SETTLED_TTL_S = DEFAULT_FINISHED_TTL_S

_STORED = ("input_tokens", "output_tokens", "usd", "calls")
#: The counters a reset zeroes: spent, and the part of it charged at holds.
_SPENT = ("spent", "lapsed")
#: Scope kinds whose names :meth:`BudgetLedger.set_limits` keeps in an index (a few,
#: long-lived); run and batch scopes are one per run or batch.
INDEXED_KINDS = ("global:", "user:")


# --- conversions ------------------------------------------------------------------
def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _usd_up(usd: float) -> int:
    """Dollars to micro-dollars, rounded up (a charge is never under-counted)."""
    return math.ceil(round(usd * 1_000_000, 6))


def _usd_down(usd: float) -> int:
    """Dollars to micro-dollars, rounded down (a limit is never loosened)."""
    return math.floor(round(usd * 1_000_000, 6))


def _wire(amount: Amount) -> str:
    return f"{amount.input_tokens},{amount.output_tokens},{_usd_up(amount.usd)},{amount.calls}"


def _from_wire(unit: str, value: Any) -> float:
    number = int(value)
    return number / 1_000_000 if unit == USD else number


def _amount(hash_: dict[str, str], prefix: str) -> Amount:
    get = {unit: int(hash_.get(f"{prefix}:{unit}", 0)) for unit in _STORED}
    return Amount(
        input_tokens=get["input_tokens"],
        output_tokens=get["output_tokens"],
        usd=get["usd"] / 1_000_000,
        calls=get["calls"],
    )


def _check_scopes(scopes: list[str]) -> list[str]:
    if isinstance(scopes, str) or not scopes:
        raise ConfigError(f"scopes must be a non-empty list of scope strings, got {scopes!r}")
    for item in scopes:
        parse_scope(item)
    if len(set(scopes)) != len(scopes):
        raise ConfigError(f"scopes must not repeat: {scopes!r}")
    return list(scopes)


#: The interruption reason of a run stopped because a budget scope lost its limit.
LIMIT_LOST = "budget:limit_lost"


class LimitLost(DuetError):
    """A budget scope had a limit set and Redis no longer has it (its hash evicted or
    deleted): an error, never "unlimited", so the cap is not silently gone."""

    def __init__(self, scope: str) -> None:
        super().__init__(
            f"budget scope {scope} had a limit and Redis no longer has it (evicted, or its "
            f"key deleted): its spending is not capped; set the limit again "
            f"(`duet budget set {scope} ...`) or forget the scope"
        )
        self.scope = scope


def _check_step(step_id: str) -> None:
    if not isinstance(step_id, str) or not step_id:
        raise ConfigError(f"step_id must be a non-empty string, got {step_id!r}")


def _settled_keys(step_id: str) -> list[str]:
    """The settle script's last keys: the call's run's settled hash and its record."""
    return [keys.budget_settled(step_id), keys.run(step_id.partition(":")[0])]


def _scope_keys(scopes: list[str]) -> list[str]:
    out: list[str] = []
    for item in scopes:
        out += [keys.budget(item), keys.budget_reservations(item), keys.budget_holds(item)]
    return out


@dataclass(frozen=True, slots=True)
class Spend:
    """A call's usage to add to the spent counters of scopes that have no limit: such a
    call holds nothing, so there is no hold to drop and no settled marker; the step's
    store adds it, once (see ``RunStore.complete_step``)."""

    #: The scopes' budget hashes.
    keys: tuple[str, ...]
    #: The usage as the budget scripts take it (``input,output,usd_micros,calls``).
    amount: str


def spend_of(scopes: list[str], actual: Amount) -> Spend:
    """What :class:`Spend` adds ``actual`` to the spent counters of ``scopes``."""
    return Spend(tuple(keys.budget(s) for s in _check_scopes(scopes)), _wire(actual))


@dataclass(frozen=True)
class ScopeState:
    """A snapshot of one budget scope.

    Attributes:
        scope: the scope string.
        limits: the limits that are on, by unit (dollars for ``usd``).
        warn_at: the warning threshold, as a fraction of each limit.
        spent: settled usage.
        reserved: held by in-flight calls.
        remaining: per limited unit, ``limit - spent - reserved`` (never below 0).
        open_reservations: how many calls hold a reservation now.
        lapsed: of ``spent``, what calls whose outcome died with their worker were
            charged: their whole hold (the vendor's bill for them is unknown, at most it).
    """

    scope: str
    limits: dict[str, float]
    warn_at: float
    spent: Amount
    reserved: Amount
    remaining: dict[str, float] = field(default_factory=dict)
    open_reservations: int = 0
    lapsed: Amount = ZERO

    @property
    def budget(self) -> Budget:
        """The scope's limits as a :class:`Budget` (all off when none was set)."""
        fields: dict[str, Any] = {f"max_{u}": v for u, v in self.limits.items()}
        return Budget(warn_at=self.warn_at, **fields)


def warning_flag(scope: str, unit: str) -> tuple[str, str]:
    """Where the one-time warning of ``unit`` in ``scope`` is recorded: (hash key, field)."""
    return keys.budget(scope), f"warned:{unit}"


class BudgetLedger:
    """Budgets shared by the whole fleet, kept in Redis and changed atomically.

    Build one per process and reuse it: the scripts are registered once per ledger and
    run as EVALSHA afterwards.

    Args:
        redis_client: a ``redis.Redis`` (bytes or decoded responses both work).
    """

    def __init__(self, redis_client: Any) -> None:
        self.redis = redis_client
        self._reserve = scripts.register(redis_client, "budget_reserve")
        self._settle = scripts.register(redis_client, "budget_settle")
        self._release = scripts.register(redis_client, "budget_release")
        self._renew = scripts.register(redis_client, "budget_renew")
        self._charge = scripts.register(redis_client, "budget_charge")
        self._status = scripts.register(redis_client, "budget_status")
        self._get = scripts.register(redis_client, "budget_get")
        self._set_limits = scripts.register(redis_client, "budget_set_limits")

    # --- administration ---------------------------------------------------------
    def set_limits(self, scope: str, budget: Budget) -> None:
        """Set (or replace) a scope's limits; spent and reserved counters are kept."""
        parse_scope(scope)
        limits = budget.limits()
        args = [repr(float(budget.warn_at))]
        for unit in UNITS:
            limit = limits.get(unit)
            if limit is None:
                args.append("")
            else:
                args.append(str(_usd_down(limit) if unit == USD else int(limit)))
        call = ScriptCall(self._set_limits, [keys.budget(scope), keys.budget_holds(scope)], args)
        replicas.run_durable(self.redis, [call])
        if scope.startswith(INDEXED_KINDS):
            self.redis.sadd(keys.budget_index(), scope)

    def get(self, scope: str) -> ScopeState:
        """The scope's limits, spent, reserved and remaining (expired holds charged first)."""
        parse_scope(scope)
        raw = self._get(keys=_scope_keys([scope]))
        open_count = int(raw[0])
        hash_ = {_s(raw[i]): _s(raw[i + 1]) for i in range(1, len(raw), 2)}
        limits = {
            unit: _from_wire(unit, hash_[f"limit:{unit}"])
            for unit in UNITS
            if f"limit:{unit}" in hash_
        }
        spent, reserved = _amount(hash_, "spent"), _amount(hash_, "reserved")
        remaining = {
            unit: max(0, limit - spent.value(unit) - reserved.value(unit))
            for unit, limit in limits.items()
        }
        if USD in remaining:
            remaining[USD] = round(remaining[USD], 6)
        return ScopeState(
            scope=scope,
            limits=limits,
            warn_at=float(hash_.get("warn_at", 0.8)),
            spent=spent,
            reserved=reserved,
            remaining=remaining,
            open_reservations=open_count,
            lapsed=_amount(hash_, "lapsed"),
        )

    def reset(self, scope: str) -> None:
        """Zero the scope's spent counters and re-arm its warnings; limits and holds stay."""
        parse_scope(scope)
        key = keys.budget(scope)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping={f"{kind}:{unit}": 0 for unit in _STORED for kind in _SPENT})
        pipe.hdel(key, *(f"warned:{unit}" for unit in UNITS))
        pipe.execute()

    def delete(self, scope: str) -> None:
        """Forget the scope entirely: limits, counters and open holds."""
        parse_scope(scope)
        self.redis.delete(*_scope_keys([scope]))
        self.redis.srem(keys.budget_index(), scope)

    def indexed_scopes(self) -> list[str]:
        """The ``global:`` and ``user:`` scopes given limits (and not deleted since)."""
        return sorted(_s(s) for s in self.redis.smembers(keys.budget_index()))

    def expire(self, scope: str, seconds: int) -> None:
        """Let the scope's keys expire after ``seconds`` (e.g. a finished run's scope)."""
        parse_scope(scope)
        pipe = self.redis.pipeline(transaction=False)
        for key in _scope_keys([scope]):
            pipe.expire(key, int(seconds))
        pipe.execute()

    def list_scopes(self, prefix: str = "") -> list[str]:
        """Scopes with any budget data whose name starts with ``prefix`` (e.g. ``"user:"``)."""
        base = keys.budget("")
        escaped = "".join("\\" + c if c in "*?[]\\" else c for c in base + prefix)
        found = set()
        for key in self.redis.scan_iter(match=escaped + "*", count=1000):
            name = _s(key)[len(base) :]
            kind, _, rest = name.partition(":")
            if rest and ":" not in rest:  # skip the ':leases' and ':holds' companions
                found.add(name)
        return sorted(found)

    # --- the call path ----------------------------------------------------------
    def reserve(
        self, step_id: str, scopes: list[str], estimate: Amount, lease_s: float
    ) -> Refusal | None:
        """Hold ``estimate`` in every scope before a call, or hold nothing anywhere.

        Expired holds in these scopes are charged first (their calls' outcome is unknown). A step that already holds a
        reservation in every scope keeps it (its lease is extended); a step already
        settled reserves nothing. Both count as success.

        Args:
            step_id: unique id of the model call (the same id goes to :meth:`settle`).
            scopes: every scope the call is charged to.
            estimate: the call's worst case (input tokens, ``max_tokens`` output, ...).
            lease_s: seconds after which the hold is charged if neither settled nor
                released nor renewed (see :meth:`renew_call`).

        Returns:
            ``None`` when the hold is in place, else a :class:`Refusal` naming the first
            scope and unit without room.

        Raises:
            LimitLost: a scope had a limit and Redis no longer has it.
        """
        _check_step(step_id)
        scopes = _check_scopes(scopes)
        if lease_s <= 0:
            raise ConfigError(f"lease_s must be > 0, got {lease_s!r}")
        call = ScriptCall(
            self._reserve,
            [*_scope_keys(scopes), keys.budget_settled(step_id)],
            [step_id, max(1, math.ceil(lease_s * 1000)), _wire(estimate), len(scopes)],
        )
        try:
            reply = replicas.run_durable(self.redis, [call])[0]
        except replicas.NotReplicated:
            # Not acknowledged, yet it may be there (a new primary with no replica yet): no
            # call is made for it, so it goes, or its lease would charge it for nothing.
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                self.release(step_id, scopes)
            raise
        if _s(reply[0]) == "lost":
            raise LimitLost(scopes[int(reply[1])])
        if _s(reply[0]) != "refused":
            return None
        unit = _s(reply[2])
        limit, spent, reserved, requested = (_from_wire(unit, v) for v in reply[3:7])
        return Refusal(
            scope=scopes[int(reply[1])],
            unit=unit,
            limit=limit,
            spent=spent,
            reserved=reserved,
            requested=requested,
        )

    def settle(
        self,
        step_id: str,
        scopes: list[str],
        actual: Amount,
        *,
        marker_ttl_s: int = DEFAULT_SETTLED_TTL_S,
    ) -> bool:
        """Charge a call's real usage to every scope and drop its hold, once per step.

        Charges even when the hold already expired (usage is always counted).

        Returns:
            True when charged now; False when the step was already settled (no change).
        """
        _check_step(step_id)
        scopes = _check_scopes(scopes)
        reply = self._settle(
            keys=[*_scope_keys(scopes), *_settled_keys(step_id)],
            args=[step_id, int(marker_ttl_s), _wire(actual), len(scopes)],
        )
        return bool(int(reply))

    def settle_call(
        self,
        step_id: str,
        scopes: list[str],
        actual: Amount,
        *,
        marker_ttl_s: int = DEFAULT_SETTLED_TTL_S,
    ) -> ScriptCall:
        """:meth:`settle` as a script call, to run with other writes in one round trip
        (:func:`orchestration.state.scripts.run_scripts`)."""
        _check_step(step_id)
        scopes = _check_scopes(scopes)
        return ScriptCall(
            self._settle,
            [*_scope_keys(scopes), *_settled_keys(step_id)],
            [step_id, int(marker_ttl_s), _wire(actual), len(scopes)],
        )

    def renew_call(self, step_id: str, scopes: list[str], lease_s: float) -> ScriptCall:
        """Push the lease of a call in flight's hold ``lease_s`` seconds past now (never
        shorter), as a script call to run with others in one round trip."""
        _check_step(step_id)
        scopes = _check_scopes(scopes)
        return ScriptCall(
            self._renew,
            _scope_keys(scopes),
            [step_id, max(1, math.ceil(lease_s * 1000)), len(scopes)],
        )

    def release(self, step_id: str, scopes: list[str]) -> bool:
        """Drop a step's hold without charging anything (the call failed, nothing spent).

        Returns:
            True when a hold existed in at least one scope.
        """
        _check_step(step_id)
        scopes = _check_scopes(scopes)
        return int(self._release(keys=_scope_keys(scopes), args=[step_id, len(scopes)])) > 0

    def charge_hold(self, step_id: str, scopes: list[str]) -> bool:
        """Charge a step's hold now, in full, as if its lease ran out (its call's worker
        is dead: the vendor may have billed it).

        Returns:
            True when a hold existed in at least one scope.
        """
        _check_step(step_id)
        scopes = _check_scopes(scopes)
        return int(self._charge(keys=_scope_keys(scopes), args=[step_id, len(scopes)])) > 0

    def round_status(self, scopes: list[str], *, include_reserved: bool = False) -> BudgetStatus:
        """The budget check before a round, for all scopes in one round trip.

        ``blocked`` is the first (scope, unit) whose spent has reached its limit.
        ``warnings`` are the (scope, unit) pairs past ``warn_at`` whose warning has not
        been emitted yet. Reading them marks nothing: the coordinator's transition sets
        each one's :func:`warning_flag` in the same script that records it and emits the
        event only if it set the flag, so each warning is emitted once ever, fleet-wide,
        by a transition that happened.

        Args:
            include_reserved: count other calls' open holds as used. Off by default:
                holds are worst cases that settle lower, so a full-looking scope may still
                have room; the step's own :meth:`reserve` is the hard gate.
        """
        scopes = _check_scopes(scopes)
        reply = self._status(
            keys=_scope_keys(scopes), args=[len(scopes), "1" if include_reserved else "0"]
        )
        index = int(reply[0])
        if index < 0:
            raise LimitLost(scopes[-index - 1])
        blocked = (scopes[index - 1], _s(reply[1])) if index else None
        warnings = [
            BudgetWarning(scopes[int(reply[i])], _s(reply[i + 1]), float(_s(reply[i + 2])))
            for i in range(2, len(reply), 3)
        ]
        return BudgetStatus(blocked=blocked, warnings=warnings)
