"""Fleet-wide budgets and rate limits: the atomic Redis side of :mod:`orchestration.core.budget`.

Every operation is one Lua script (one round trip, EVALSHA after the first call), so
any number of workers on any number of machines share one hard cap:

- :meth:`BudgetLedger.reserve` holds a call's worst case in every scope of the call
  before the call is made, or holds nothing and says which limit was in the way;
- :meth:`BudgetLedger.settle` swaps the hold for the real usage, once per step;
- a worker that dies between the two loses its hold when the lease runs out.

Per scope Redis keeps (see :mod:`orchestration.state.keys`): a hash of limits and counters
(``limit:<unit>``, ``spent:<unit>``, ``reserved:<unit>``, ``warn_at``, ``warned:<unit>``),
a sorted set of open holds scored by lease expiry (ms, server clock), and a hash of the
amount of each open hold so it is released exactly. Dollars are stored as integer
micro-dollars so Lua adds them exactly; charges round up, limits round down.

All clocks are the Redis server's (``TIME``), never the caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orchestration.core.budget import (
    UNITS,
    USD,
    Amount,
    Budget,
    BudgetStatus,
    BudgetWarning,
    Refusal,
    parse_scope,
)
from orchestration.core.errors import ConfigError
from orchestration.state import keys

#: Seconds a settled-step marker lives (a redelivered step is charged once within it).
DEFAULT_SETTLED_TTL_S = keys.DEFAULT_FINISHED_TTL_S

_STORED = ("input_tokens", "output_tokens", "usd", "calls")
#: Scope kinds whose names :meth:`BudgetLedger.set_limits` keeps in an index (a few,
#: long-lived); run and batch scopes are one per run or batch.
INDEXED_KINDS = ("global:", "user:")


# --- Lua ------------------------------------------------------------------------
# Amounts travel as "input,output,usd_micros,calls" strings, so Lua never formats a
# large number itself (tostring would switch to exponent notation).
_LUA_COMMON = """
local STORED = {'input_tokens', 'output_tokens', 'usd', 'calls'}
local UNITS = {'input_tokens', 'output_tokens', 'tokens', 'usd', 'calls'}

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function split(s)
  local a, b, c, d = string.match(s, '^(%d+),(%d+),(%d+),(%d+)$')
  return {a, b, c, d}
end

local function add(bkey, prefix, parts, sign)
  for k = 1, 4 do
    if parts[k] ~= '0' then
      redis.call('HINCRBY', bkey, prefix .. STORED[k], sign .. parts[k])
    end
  end
end

local function release_one(bkey, lkey, hkey, step)
  redis.call('ZREM', lkey, step)
  local held = redis.call('HGET', hkey, step)
  if not held then return 0 end
  redis.call('HDEL', hkey, step)
  add(bkey, 'reserved:', split(held), '-')
  return 1
end

local function purge(bkey, lkey, hkey, now)
  local expired = redis.call('ZRANGEBYSCORE', lkey, '-inf', now)
  for _, step in ipairs(expired) do release_one(bkey, lkey, hkey, step) end
end

local function num(v)
  if v then return tonumber(v) end
  return 0
end

local function value(v, unit)
  if unit == 'input_tokens' then return v[1] end
  if unit == 'output_tokens' then return v[2] end
  if unit == 'tokens' then return v[1] + v[2] end
  if unit == 'usd' then return v[3] end
  return v[4]
end

local function load(bkey)
  local r = redis.call('HMGET', bkey,
    'limit:input_tokens', 'limit:output_tokens', 'limit:tokens', 'limit:usd', 'limit:calls',
    'spent:input_tokens', 'spent:output_tokens', 'spent:usd', 'spent:calls',
    'reserved:input_tokens', 'reserved:output_tokens', 'reserved:usd', 'reserved:calls',
    'warn_at')
  local limits = {}
  for k = 1, 5 do
    if r[k] then limits[UNITS[k]] = tonumber(r[k]) end
  end
  local warn_at = 0.8
  if r[14] then warn_at = tonumber(r[14]) end
  return limits, {num(r[6]), num(r[7]), num(r[8]), num(r[9])},
    {num(r[10]), num(r[11]), num(r[12]), num(r[13])}, warn_at
end
"""

# KEYS: (budget, leases, holds) per scope, then the step's settled marker.
# ARGV: step_id, lease_ms, amount, scope count.
_LUA_RESERVE = (
    _LUA_COMMON
    + """
local step, lease, amount, n = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[3 * n + 1]) == 1 then return {'settled'} end
local now = now_ms()
local est = split(amount)
local est_n = {tonumber(est[1]), tonumber(est[2]), tonumber(est[3]), tonumber(est[4])}
local everywhere = true
for i = 0, n - 1 do
  purge(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3], now)
  if redis.call('HEXISTS', KEYS[3 * i + 3], step) == 0 then everywhere = false end
end
if everywhere then
  -- a redelivered step: keep its hold, stretch the lease for the new attempt
  for i = 0, n - 1 do redis.call('ZADD', KEYS[3 * i + 2], 'GT', now + lease, step) end
  return {'held'}
end
for i = 0, n - 1 do
  local limits, spent, reserved = load(KEYS[3 * i + 1])
  local own = redis.call('HGET', KEYS[3 * i + 3], step)
  if own then
    own = split(own)
    for k = 1, 4 do reserved[k] = reserved[k] - tonumber(own[k]) end
  end
  for _, unit in ipairs(UNITS) do
    local limit = limits[unit]
    if limit then
      local s, r, e = value(spent, unit), value(reserved, unit), value(est_n, unit)
      if s + r + e > limit then return {'refused', i, unit, limit, s, r, e} end
    end
  end
end
for i = 0, n - 1 do
  local bkey, lkey, hkey = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  release_one(bkey, lkey, hkey, step)
  add(bkey, 'reserved:', est, '')
  redis.call('HSET', hkey, step, amount)
  redis.call('ZADD', lkey, now + lease, step)
end
return {'ok'}
"""
)

# KEYS: (budget, leases, holds) per scope, then the step's settled marker.
# ARGV: step_id, marker ttl (s), amount, scope count.
_LUA_SETTLE = (
    _LUA_COMMON
    + """
local step, ttl, amount, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local marker = KEYS[3 * n + 1]
if redis.call('EXISTS', marker) == 1 then return 0 end
local actual = split(amount)
for i = 0, n - 1 do
  release_one(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3], step)
  add(KEYS[3 * i + 1], 'spent:', actual, '')
end
redis.call('SET', marker, '1', 'EX', ttl)
return 1
"""
)

# KEYS: (budget, leases, holds) per scope. ARGV: step_id, scope count.
_LUA_RELEASE = (
    _LUA_COMMON
    + """
local released = 0
for i = 0, tonumber(ARGV[2]) - 1 do
  released = released + release_one(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3], ARGV[1])
end
return released
"""
)

# KEYS: (budget, leases, holds) per scope. ARGV: scope count, include_reserved (0/1).
# Returns {blocked scope index + 1 (0: none), blocked unit, then per warning not yet
# emitted: scope index, unit, fraction}. It sets no flag: the transition that emits the
# warning does, in its own script (see ``warning_flag``), so a lost race emits nothing
# and loses nothing.
_LUA_STATUS = (
    _LUA_COMMON
    + """
local n, with_reserved = tonumber(ARGV[1]), ARGV[2] == '1'
local now = now_ms()
local out = {0, ''}
for i = 0, n - 1 do
  local bkey = KEYS[3 * i + 1]
  purge(bkey, KEYS[3 * i + 2], KEYS[3 * i + 3], now)
  local limits, spent, reserved, warn_at = load(bkey)
  for _, unit in ipairs(UNITS) do
    local limit = limits[unit]
    if limit then
      local used = value(spent, unit)
      if with_reserved then used = used + value(reserved, unit) end
      if out[1] == 0 and used >= limit then
        out[1] = i + 1
        out[2] = unit
      end
      if used >= warn_at * limit and redis.call('HEXISTS', bkey, 'warned:' .. unit) == 0 then
        local fraction = 1
        if limit > 0 then fraction = used / limit end
        table.insert(out, i)
        table.insert(out, unit)
        table.insert(out, tostring(fraction))
      end
    end
  end
end
return out
"""
)

# KEYS: budget, leases, holds. Returns {open holds, then the budget hash as pairs}.
_LUA_GET = (
    _LUA_COMMON
    + """
purge(KEYS[1], KEYS[2], KEYS[3], now_ms())
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, redis.call('ZCARD', KEYS[2]))
return out
"""
)

# KEYS: budget. ARGV: warn_at, then one limit per unit ('' = off). A changed limit or
# threshold re-arms its one-time warning; setting the same values again changes nothing.
_LUA_SET_LIMITS = (
    _LUA_COMMON
    + """
local bkey = KEYS[1]
if redis.call('HGET', bkey, 'warn_at') ~= ARGV[1] then
  redis.call('HSET', bkey, 'warn_at', ARGV[1])
  for _, unit in ipairs(UNITS) do redis.call('HDEL', bkey, 'warned:' .. unit) end
end
for k, unit in ipairs(UNITS) do
  local new, old = ARGV[k + 1], redis.call('HGET', bkey, 'limit:' .. unit)
  if new == '' then
    if old then redis.call('HDEL', bkey, 'limit:' .. unit, 'warned:' .. unit) end
  elseif old ~= new then
    redis.call('HSET', bkey, 'limit:' .. unit, new)
    redis.call('HDEL', bkey, 'warned:' .. unit)
  end
end
return 1
"""
)


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


def _check_step(step_id: str) -> None:
    if not isinstance(step_id, str) or not step_id:
        raise ConfigError(f"step_id must be a non-empty string, got {step_id!r}")


def _scope_keys(scopes: list[str]) -> list[str]:
    out: list[str] = []
    for item in scopes:
        out += [keys.budget(item), keys.budget_reservations(item), keys.budget_holds(item)]
    return out


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
    """

    scope: str
    limits: dict[str, float]
    warn_at: float
    spent: Amount
    reserved: Amount
    remaining: dict[str, float] = field(default_factory=dict)
    open_reservations: int = 0

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
        self._reserve = redis_client.register_script(_LUA_RESERVE)
        self._settle = redis_client.register_script(_LUA_SETTLE)
        self._release = redis_client.register_script(_LUA_RELEASE)
        self._status = redis_client.register_script(_LUA_STATUS)
        self._get = redis_client.register_script(_LUA_GET)
        self._set_limits = redis_client.register_script(_LUA_SET_LIMITS)

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
        self._set_limits(keys=[keys.budget(scope)], args=args)
        if scope.startswith(INDEXED_KINDS):
            self.redis.sadd(keys.budget_index(), scope)

    def get(self, scope: str) -> ScopeState:
        """The scope's limits, spent, reserved and remaining (expired holds released first)."""
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
        )

    def reset(self, scope: str) -> None:
        """Zero the scope's spent counters and re-arm its warnings; limits and holds stay."""
        parse_scope(scope)
        key = keys.budget(scope)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping={f"spent:{unit}": 0 for unit in _STORED})
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

        Expired holds in these scopes are released first. A step that already holds a
        reservation in every scope keeps it (its lease is extended); a step already
        settled reserves nothing. Both count as success.

        Args:
            step_id: unique id of the model call (the same id goes to :meth:`settle`).
            scopes: every scope the call is charged to.
            estimate: the call's worst case (input tokens, ``max_tokens`` output, ...).
            lease_s: seconds after which the hold is released if never settled; longer
                than the call can take.

        Returns:
            ``None`` when the hold is in place, else a :class:`Refusal` naming the first
            scope and unit without room.
        """
        _check_step(step_id)
        scopes = _check_scopes(scopes)
        if lease_s <= 0:
            raise ConfigError(f"lease_s must be > 0, got {lease_s!r}")
        reply = self._reserve(
            keys=[*_scope_keys(scopes), keys.budget_settled(step_id)],
            args=[step_id, max(1, math.ceil(lease_s * 1000)), _wire(estimate), len(scopes)],
        )
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
            keys=[*_scope_keys(scopes), keys.budget_settled(step_id)],
            args=[step_id, int(marker_ttl_s), _wire(actual), len(scopes)],
        )
        return bool(int(reply))

    def release(self, step_id: str, scopes: list[str]) -> bool:
        """Drop a step's hold without charging anything (the call failed, nothing spent).

        Returns:
            True when a hold existed in at least one scope.
        """
        _check_step(step_id)
        scopes = _check_scopes(scopes)
        return int(self._release(keys=_scope_keys(scopes), args=[step_id, len(scopes)])) > 0

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
        blocked = (scopes[index - 1], _s(reply[1])) if index else None
        warnings = [
            BudgetWarning(scopes[int(reply[i])], _s(reply[i + 1]), float(_s(reply[i + 2])))
            for i in range(2, len(reply), 3)
        ]
        return BudgetStatus(blocked=blocked, warnings=warnings)


# --- rate limits ------------------------------------------------------------------
# A sliding log per (provider, model): one sorted-set member "<seq>:<tokens>" per granted
# request, scored by its server time in microseconds (integers, exact in a double), plus
# a running token sum. A request goes when, counting it, the last window holds at most
# rpm requests and tpm tokens; otherwise the reply is how long until enough old grants
# leave the window. Unlike GCRA with a full burst, no window ever holds more than rpm.
# KEYS: log, token sum hash, pause. ARGV: rpm (-1: off), tpm (-1: off), tokens, window_us.
# Returns {wait_us, server_now_us}.
_LUA_ACQUIRE = """
local log, state, pause = KEYS[1], KEYS[2], KEYS[3]
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local paused = redis.call('PTTL', pause)
if paused > 0 then return {paused * 1000, now} end
if rpm < 0 and tpm < 0 then return {0, now} end
local horizon = now - window
local old = redis.call('ZRANGEBYSCORE', log, '-inf', horizon)
if #old > 0 then
  local freed = 0
  for _, m in ipairs(old) do freed = freed + tonumber(string.match(m, ':(%d+)$')) end
  if freed > 0 then redis.call('HINCRBY', state, 'tokens', -freed) end
  redis.call('ZREMRANGEBYSCORE', log, '-inf', horizon)
end
local wait = 0
local count = redis.call('ZCARD', log)
if rpm >= 0 and count >= rpm then
  -- the oldest count - rpm + 1 grants must leave the window first
  local e = redis.call('ZRANGE', log, count - rpm, count - rpm, 'WITHSCORES')
  wait = tonumber(e[2]) + window - now
end
if tpm >= 0 then
  local need = tonumber(redis.call('HGET', state, 'tokens') or '0') + tokens - tpm
  if need > 0 then
    local freed, start, w = 0, 0, window
    while freed < need do
      local batch = redis.call('ZRANGE', log, start, start + 99, 'WITHSCORES')
      if #batch == 0 then break end
      for j = 1, #batch, 2 do
        freed = freed + tonumber(string.match(batch[j], ':(%d+)$'))
        if freed >= need then
          w = tonumber(batch[j + 1]) + window - now
          break
        end
      end
      start = start + 100
    end
    if w > wait then wait = w end
  end
end
if wait > 0 then return {wait, now} end
local seq = redis.call('HINCRBY', state, 'seq', 1)
redis.call('ZADD', log, now, seq .. ':' .. ARGV[3])
redis.call('HINCRBY', state, 'tokens', ARGV[3])
local idle_ms = math.floor(window / 1000) + 1000
redis.call('PEXPIRE', log, idle_ms)
redis.call('PEXPIRE', state, idle_ms)
return {0, now}
"""

# KEYS: pause. ARGV: milliseconds. Keeps the longer of the current and the new pause.
_LUA_PAUSE = """
local cur = redis.call('PTTL', KEYS[1])
if cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
  return tonumber(ARGV[1])
end
return cur
"""


@dataclass(frozen=True)
class RateDecision:
    """Answer of :meth:`RateLimiter.try_acquire`.

    Attributes:
        wait_s: 0.0 when the request was granted (and counted); else seconds to wait
            before asking again (nothing was counted).
        server_time_us: the Redis server time of the decision, in microseconds.
    """

    wait_s: float
    server_time_us: int

    @property
    def granted(self) -> bool:
        return self.wait_s == 0.0


def _check_rate(name: str, value: int | None) -> int:
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")
    return value


class RateLimiter:
    """Requests and tokens per window per (provider, model), shared by every worker.

    Every caller for one (provider, model) must use the same ``rpm``, ``tpm`` and
    ``window_s``.

    Args:
        redis_client: a ``redis.Redis``.
    """

    def __init__(self, redis_client: Any) -> None:
        self.redis = redis_client
        self._acquire = redis_client.register_script(_LUA_ACQUIRE)
        self._pause = redis_client.register_script(_LUA_PAUSE)

    def try_acquire(
        self,
        provider: str,
        model: str,
        *,
        rpm: int | None,
        tpm: int | None,
        tokens: int,
        window_s: float = 60.0,
    ) -> RateDecision:
        """Count one request of ``tokens`` if it may go now, else say how long to wait.

        A fleet-wide pause (:meth:`pause`) answers with its remaining time.

        Raises:
            ConfigError: a limit that is not a positive integer, negative ``tokens``, or
                ``tokens`` above ``tpm`` (such a request could never go).
        """
        rpm_arg, tpm_arg = _check_rate("rpm", rpm), _check_rate("tpm", tpm)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ConfigError(f"tokens must be an integer >= 0, got {tokens!r}")
        if tpm is not None and tokens > tpm:
            raise ConfigError(f"a request of {tokens} tokens can never fit tpm={tpm}")
        if window_s <= 0:
            raise ConfigError(f"window_s must be > 0, got {window_s!r}")
        wait_us, now_us = self._acquire(
            keys=[
                keys.rate_limit(provider, model),
                keys.rate_tokens(provider, model),
                keys.rate_pause(provider, model),
            ],
            args=[rpm_arg, tpm_arg, tokens, max(1, round(window_s * 1_000_000))],
        )
        return RateDecision(wait_s=int(wait_us) / 1_000_000, server_time_us=int(now_us))

    def acquire(
        self,
        provider: str,
        model: str,
        *,
        rpm: int | None,
        tpm: int | None,
        tokens: int,
        window_s: float = 60.0,
    ) -> float:
        """0.0 when the request may go now (it is counted), else seconds to wait (not counted)."""
        return self.try_acquire(
            provider, model, rpm=rpm, tpm=tpm, tokens=tokens, window_s=window_s
        ).wait_s

    def pause(self, provider: str, model: str, seconds: float) -> float:
        """Pause the (provider, model) for the whole fleet, e.g. after a 429 with Retry-After.

        A longer pause already in place is kept. Returns the pause now in force, in seconds.
        """
        if seconds <= 0:
            return self.paused_for(provider, model)
        ms = self._pause(
            keys=[keys.rate_pause(provider, model)], args=[max(1, math.ceil(seconds * 1000))]
        )
        return int(ms) / 1000

    def paused_for(self, provider: str, model: str) -> float:
        """Seconds left of a fleet-wide pause of the (provider, model); 0.0 when none."""
        ms = int(self.redis.pttl(keys.rate_pause(provider, model)))
        return ms / 1000 if ms > 0 else 0.0
