"""The budget ledger and rate limiter's semantics, on fakeredis (and the real Lua engine).

Every test runs on fakeredis; the same tests also run on the real server (marked
``redis``) because fakeredis's Lua is an emulation and the scripts must hold on both.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from orchestration.core.budget import CALLS, TOKENS, UNITS, USD, Amount, Budget
from orchestration.core.errors import ConfigError
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger, warning_flag
from orchestration.state.keys import budget_holds, rate_tokens
from orchestration.state.ratelimits import RateLimiter

LONG = 60.0  # a lease no test outlives


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.redis)])
def r(request):
    """A Redis client: fakeredis, and the real server."""
    if request.param == "fake":
        return request.getfixturevalue("fake_redis")
    return request.getfixturevalue("redis_client")


@pytest.fixture
def ledger(r) -> BudgetLedger:
    return BudgetLedger(r)


@pytest.fixture
def limiter(r) -> RateLimiter:
    return RateLimiter(r)


def amt(i: int = 0, o: int = 0, usd: float = 0.0, calls: int = 0) -> Amount:
    return Amount(input_tokens=i, output_tokens=o, usd=usd, calls=calls)


def server_ms(r) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def lease_expiry_ms(r, scope: str, step_id: str) -> int:
    score = r.zscore(keys.budget_reservations(scope), step_id)
    assert score is not None, f"{step_id} holds nothing in {scope}"
    return int(score)


# --- reserve / settle / release -----------------------------------------------------
def test_reserve_then_settle_moves_the_hold_to_spent_in_every_scope(ledger):
    scopes = ["run:r1", "user:u1", "global:fleet"]
    ledger.set_limits("global:fleet", Budget(max_tokens=5000, max_usd=2.0, max_calls=10))

    assert ledger.reserve("s1", scopes, amt(100, 400, 0.01, 1), LONG) is None
    for s in scopes:
        state = ledger.get(s)
        assert state.reserved == amt(100, 400, 0.01, 1)
        assert state.spent == amt()
        assert state.open_reservations == 1
    assert ledger.get("global:fleet").remaining == {TOKENS: 4500, USD: 1.99, CALLS: 9}

    assert ledger.settle("s1", scopes, amt(100, 150, 0.004, 1)) is True
    for s in scopes:
        state = ledger.get(s)
        assert state.spent == amt(100, 150, 0.004, 1)
        assert state.reserved == amt()
        assert state.open_reservations == 0
    assert ledger.get("global:fleet").remaining == {TOKENS: 4750, USD: 1.996, CALLS: 9}


def test_settle_is_idempotent_per_step(ledger, r):
    scopes = ["run:r1", "global:fleet"]
    assert ledger.reserve("s1", scopes, amt(10, 10, calls=1), LONG) is None
    assert ledger.settle("s1", scopes, amt(10, 5, calls=1)) is True
    before = {s: ledger.get(s) for s in scopes}
    # a redelivered step settles again, with the same or other numbers: nothing changes
    assert ledger.settle("s1", scopes, amt(10, 5, calls=1)) is False
    assert ledger.settle("s1", scopes, amt(999, 999, 9.0, 9)) is False
    assert {s: ledger.get(s) for s in scopes} == before
    assert r.ttl(keys.budget_settled("s1")) > 0


def test_reserve_is_idempotent_per_step_and_a_settled_step_reserves_nothing(ledger):
    scopes = ["run:r1", "global:fleet"]
    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    assert ledger.reserve("s1", scopes, amt(60), LONG) is None
    assert ledger.reserve("s1", scopes, amt(60), LONG) is None  # counted once, not refused
    assert ledger.get("global:fleet").reserved == amt(60)
    assert ledger.settle("s1", scopes, amt(30)) is True
    assert ledger.reserve("s1", scopes, amt(60), LONG) is None  # already settled: no-op
    state = ledger.get("global:fleet")
    assert (state.spent, state.reserved, state.open_reservations) == (amt(30), amt(), 0)


def test_re_reserve_extends_the_lease(ledger, r):
    assert ledger.reserve("s1", ["run:r1"], amt(1), 1.0) is None
    first = lease_expiry_ms(r, "run:r1", "s1")
    assert ledger.reserve("s1", ["run:r1"], amt(1), 30.0) is None
    assert lease_expiry_ms(r, "run:r1", "s1") >= first + 25_000
    assert ledger.get("run:r1").reserved == amt(1)


def test_refusal_reserves_nothing_in_any_scope(ledger, r):
    scopes = ["run:r1", "user:u1", "global:fleet"]
    ledger.set_limits("user:u1", Budget(max_tokens=1000))
    ledger.set_limits("global:fleet", Budget(max_calls=2))
    assert ledger.reserve("a", scopes, amt(100, calls=1), LONG) is None
    assert ledger.reserve("b", scopes, amt(100, calls=1), LONG) is None
    before = {s: ledger.get(s) for s in scopes}

    refusal = ledger.reserve("c", scopes, amt(100, calls=1), LONG)
    assert refusal is not None
    assert (refusal.scope, refusal.unit) == ("global:fleet", CALLS)
    assert (refusal.limit, refusal.spent, refusal.reserved, refusal.requested) == (2, 0, 2, 1)
    assert not refusal.exhausted  # held by in-flight calls: worth retrying later
    assert refusal.reason == "budget:global:calls"
    assert {s: ledger.get(s) for s in scopes} == before
    for s in scopes:
        assert r.zscore(keys.budget_reservations(s), "c") is None
        assert not r.hexists(budget_holds(s), "c")


def test_refusal_names_the_first_scope_in_order_and_says_when_waiting_cannot_help(ledger):
    ledger.set_limits("run:r1", Budget(max_output_tokens=100))
    ledger.set_limits("global:fleet", Budget(max_tokens=50))
    refusal = ledger.reserve("s1", ["run:r1", "global:fleet"], amt(0, 200), LONG)
    assert refusal is not None and (refusal.scope, refusal.unit) == ("run:r1", "output_tokens")
    assert refusal.exhausted
    refusal = ledger.reserve("s1", ["global:fleet", "run:r1"], amt(0, 200), LONG)
    assert refusal is not None and (refusal.scope, refusal.unit) == ("global:fleet", TOKENS)


def test_reaching_a_limit_exactly_is_allowed(ledger):
    ledger.set_limits("global:fleet", Budget(max_tokens=100, max_calls=1))
    assert ledger.reserve("s1", ["global:fleet"], amt(60, 40, calls=1), LONG) is None
    refusal = ledger.reserve("s2", ["global:fleet"], amt(0, 0, calls=0), LONG)
    assert refusal is None  # a zero estimate fits even a full scope


def test_release_frees_the_hold_and_charges_nothing(ledger):
    scopes = ["run:r1", "global:fleet"]
    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    assert ledger.reserve("s1", scopes, amt(100), LONG) is None
    assert ledger.reserve("s2", scopes, amt(1), LONG) is not None
    assert ledger.release("s1", scopes) is True
    assert ledger.release("s1", scopes) is False
    for s in scopes:
        assert ledger.get(s).reserved == amt() and ledger.get(s).spent == amt()
    assert ledger.reserve("s2", scopes, amt(100), LONG) is None


def test_settle_charges_actual_usage_even_without_a_hold(ledger):
    # the hold was released (or expired, or never made): the real usage still counts
    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    assert ledger.settle("s1", ["global:fleet"], amt(70, 50)) is True
    state = ledger.get("global:fleet")
    assert state.spent == amt(70, 50)
    assert state.remaining == {TOKENS: 0}


def test_expired_lease_is_charged_by_the_next_reserve(ledger, r):
    """A hold whose lease ran out is a call whose outcome is unknown: it is charged."""
    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    assert ledger.reserve("dead", ["run:r1", "global:fleet"], amt(60), 0.3) is None
    refusal = ledger.reserve("live", ["global:fleet"], amt(50), LONG)
    assert refusal is not None and not refusal.exhausted

    expiry = lease_expiry_ms(r, "global:fleet", "dead")
    wait_for(lambda: server_ms(r) > expiry)
    # nothing but the next reserve has run: the dead hold is still a hold
    assert int(r.hget(keys.budget("global:fleet"), "reserved:input_tokens")) == 60

    assert ledger.reserve("live", ["global:fleet"], amt(30), LONG) is None
    raw = r.hgetall(keys.budget("global:fleet"))
    assert int(raw[b"reserved:input_tokens"]) == 30
    assert int(raw[b"spent:input_tokens"]) == 60
    assert not r.hexists(budget_holds("global:fleet"), "dead")
    # run:r1 was not in that reserve: its dead hold is charged when someone looks at it
    assert ledger.get("run:r1").reserved == amt()
    assert ledger.get("run:r1").spent == amt(60)


def test_a_renewed_hold_is_not_charged(ledger, r):
    from orchestration.state.scripts import run_scripts

    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    assert ledger.reserve("alive", ["global:fleet"], amt(60), 0.5) is None
    first = lease_expiry_ms(r, "global:fleet", "alive")
    run_scripts(r, [ledger.renew_call("alive", ["global:fleet"], LONG)])
    assert lease_expiry_ms(r, "global:fleet", "alive") >= first + 50_000
    wait_for(lambda: server_ms(r) > first)
    assert ledger.get("global:fleet").spent == amt()
    assert ledger.get("global:fleet").reserved == amt(60)


def test_usd_is_exact_in_micro_dollars(ledger):
    ledger.set_limits("global:fleet", Budget(max_usd=0.3))
    for step in ("a", "b", "c"):
        assert ledger.reserve(step, ["global:fleet"], amt(usd=0.1), LONG) is None
    refusal = ledger.reserve("d", ["global:fleet"], amt(usd=0.000001), LONG)
    assert refusal is not None and refusal.unit == USD
    assert refusal.reserved == pytest.approx(0.3) and refusal.requested == 0.000001
    for step in ("a", "b", "c"):
        ledger.settle(step, ["global:fleet"], amt(usd=0.1))
    state = ledger.get("global:fleet")
    assert state.spent.usd == 0.3 and state.remaining == {USD: 0.0}
    # charges round up to the next micro-dollar, never down
    ledger.settle("e", ["run:r"], amt(usd=0.0000001))
    assert ledger.get("run:r").spent.usd == 0.000001


# --- round status -------------------------------------------------------------------
def test_round_status_blocks_when_spent_reaches_a_limit(ledger):
    scopes = ["run:r1", "global:fleet"]
    ledger.set_limits("run:r1", Budget(max_calls=2, warn_at=1.0))
    ledger.set_limits("global:fleet", Budget(max_tokens=100, warn_at=1.0))
    assert ledger.round_status(scopes).blocked is None
    ledger.settle("s1", scopes, amt(99, calls=1))
    assert ledger.round_status(scopes).blocked is None
    ledger.settle("s2", scopes, amt(1, calls=1))
    status = ledger.round_status(scopes)
    assert status.blocked == ("run:r1", CALLS)
    assert status.reason == "budget:run:calls"


def test_round_status_counts_holds_only_when_asked(ledger):
    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    assert ledger.reserve("s1", ["global:fleet"], amt(100), LONG) is None
    assert ledger.round_status(["global:fleet"]).blocked is None
    status = ledger.round_status(["global:fleet"], include_reserved=True)
    assert status.blocked == ("global:fleet", TOKENS)


def _emit(r, warnings) -> None:
    """What the transition that emits warnings does to their flags (RunStore's script)."""
    for w in warnings:
        r.hsetnx(*warning_flag(w.scope, w.unit), "1")


def test_a_warning_is_reported_until_emitted_then_never_again(r):
    coordinator_a, coordinator_b = BudgetLedger(r), BudgetLedger(r)
    scopes = ["run:r1", "global:fleet"]
    coordinator_a.set_limits("global:fleet", Budget(max_tokens=100, max_usd=1.0))
    coordinator_a.set_limits("run:r1", Budget(max_calls=10, warn_at=0.5))
    coordinator_a.settle("s1", scopes, amt(79, usd=0.5, calls=5))

    first = coordinator_a.round_status(scopes)
    assert [(w.scope, w.unit) for w in first.warnings] == [("run:r1", CALLS)]
    assert first.warnings[0].fraction == 0.5
    # reading marks nothing: another coordinator still sees it until one emits it
    assert coordinator_b.round_status(scopes).warnings == first.warnings
    _emit(r, first.warnings)
    assert coordinator_b.round_status(scopes).warnings == []

    coordinator_a.settle("s2", scopes, amt(1, usd=0.3))
    second = coordinator_b.round_status(scopes)
    assert sorted((w.scope, w.unit, w.fraction) for w in second.warnings) == [
        ("global:fleet", TOKENS, 0.8),
        ("global:fleet", USD, 0.8),
    ]
    _emit(r, second.warnings)
    assert coordinator_a.round_status(scopes).warnings == []
    assert coordinator_b.round_status(scopes).warnings == []


def test_warnings_rearm_on_reset_or_a_changed_limit_only(ledger, r):
    def warned() -> int:
        found = ledger.round_status(["global:fleet"]).warnings
        _emit(r, found)
        return len(found)

    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    ledger.settle("s1", ["global:fleet"], amt(90))
    assert warned() == 1
    ledger.set_limits("global:fleet", Budget(max_tokens=100))  # same limits again
    assert warned() == 0
    ledger.set_limits("global:fleet", Budget(max_tokens=95))
    assert warned() == 1
    ledger.reset("global:fleet")
    assert warned() == 0
    ledger.settle("s2", ["global:fleet"], amt(90))
    assert warned() == 1


# --- administration -----------------------------------------------------------------
def test_limits_round_trip_and_scopes_without_limits_still_count(ledger):
    budget = Budget(max_input_tokens=1, max_output_tokens=2, max_tokens=3, max_usd=4.5, max_calls=6)
    ledger.set_limits("user:ann@example.com", budget.model_copy(update={"warn_at": 0.9}))
    state = ledger.get("user:ann@example.com")
    assert state.budget == budget.model_copy(update={"warn_at": 0.9})
    assert set(state.limits) == set(UNITS)

    ledger.set_limits("user:ann@example.com", Budget(max_usd=1.0))
    assert ledger.get("user:ann@example.com").limits == {USD: 1.0}

    ledger.settle("s1", ["batch:b1"], amt(5, 5, 0.5, 1))
    state = ledger.get("batch:b1")
    assert (state.limits, state.remaining, state.spent) == ({}, {}, amt(5, 5, 0.5, 1))
    assert ledger.get("global:never").spent == amt()


def test_reset_zeroes_spent_and_keeps_limits_and_holds(ledger):
    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    ledger.settle("s1", ["global:fleet"], amt(90))
    ledger.reserve("s2", ["global:fleet"], amt(5), LONG)
    ledger.reset("global:fleet")
    state = ledger.get("global:fleet")
    assert (state.spent, state.reserved, state.limits) == (amt(), amt(5), {TOKENS: 100})


def test_list_delete_and_expire_scopes(ledger, r):
    ledger.set_limits("global:fleet", Budget(max_tokens=100))
    ledger.reserve("s1", ["run:r1", "run:r2"], amt(1), LONG)
    ledger.settle("s0", ["user:u1"], amt(1))
    assert ledger.list_scopes() == ["global:fleet", "run:r1", "run:r2", "user:u1"]
    assert ledger.list_scopes("run:") == ["run:r1", "run:r2"]
    ledger.delete("run:r1")
    assert ledger.list_scopes("run:") == ["run:r2"]
    assert not r.exists(budget_holds("run:r1"), keys.budget_reservations("run:r1"))
    ledger.expire("run:r2", 100)
    assert 0 < r.ttl(keys.budget("run:r2")) <= 100
    assert 0 < r.ttl(keys.budget_reservations("run:r2")) <= 100


@pytest.fixture
def decoded(r):
    """A second client on the same data that decodes replies to str."""
    kwargs = r.connection_pool.connection_kwargs
    if "server" in kwargs:  # fakeredis: share the in-memory server
        import fakeredis

        client = fakeredis.FakeRedis(server=kwargs["server"], decode_responses=True)
    else:
        import redis

        client = redis.Redis(
            host=kwargs["host"], port=kwargs["port"], db=kwargs["db"], decode_responses=True
        )
    yield client
    client.close()


def test_works_with_decoded_responses(decoded):
    ledger = BudgetLedger(decoded)
    ledger.set_limits("global:fleet", Budget(max_tokens=10, warn_at=0.5))
    assert ledger.reserve("s1", ["global:fleet"], amt(11), LONG).unit == TOKENS
    assert ledger.settle("s1", ["global:fleet"], amt(6)) is True
    assert ledger.get("global:fleet").spent == amt(6)
    assert ledger.round_status(["global:fleet"]).warnings[0].unit == TOKENS
    assert ledger.list_scopes() == ["global:fleet"]
    assert RateLimiter(decoded).acquire("p", "m", rpm=1, tpm=None, tokens=1) == 0.0


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("reserve", ("s", [], amt(1), LONG)),
        ("reserve", ("s", "run:r", amt(1), LONG)),
        ("reserve", ("s", ["run:r", "run:r"], amt(1), LONG)),
        ("reserve", ("s", ["bad"], amt(1), LONG)),
        ("reserve", ("s", ["run:r"], amt(1), 0)),
        ("reserve", ("", ["run:r"], amt(1), LONG)),
        ("settle", ("s", ["team:x"], amt(1))),
        ("release", ("s", ["run:a b"])),
        ("round_status", ([],)),
        ("set_limits", ("nope", Budget())),
    ],
)
def test_bad_arguments_raise_config_error(ledger, call, args):
    with pytest.raises(ConfigError):
        getattr(ledger, call)(*args)


# --- the ledger agrees with the pure check -----------------------------------------
def test_random_operations_match_the_pure_model(ledger):
    """Reserve/settle/release at random; every decision and counter matches Budget.check."""
    rng = random.Random(7)
    limits = {
        "run:r": Budget(max_calls=30, max_usd=6.0),
        "user:u": Budget(max_input_tokens=900, max_output_tokens=700),
        "global:g": Budget(max_tokens=1500),
        "batch:b": Budget(),
    }
    for s, b in limits.items():
        ledger.set_limits(s, b)
    spent = {s: Amount() for s in limits}
    holds: dict[str, tuple[list[str], Amount]] = {}

    def reserved(s: str) -> Amount:
        total = Amount()
        for scopes, a in holds.values():
            if s in scopes:
                total = total + a
        return total

    for n in range(300):
        op = rng.random()
        if op < 0.55 or not holds:
            scopes = rng.sample(sorted(limits), rng.randint(1, 4))
            # quarter dollars are exact both as floats and as micro-dollars
            est = amt(rng.randint(0, 120), rng.randint(0, 120), rng.randint(0, 3) / 4, 1)
            expected = next(
                ((s, u) for s in scopes if (u := limits[s].check(spent[s], reserved(s), est))),
                None,
            )
            refusal = ledger.reserve(f"s{n}", scopes, est, LONG)
            assert (refusal and (refusal.scope, refusal.unit)) == expected, n
            if refusal is None:
                holds[f"s{n}"] = (scopes, est)
        else:
            step = rng.choice(sorted(holds))
            scopes, est = holds.pop(step)
            if op < 0.85:
                actual = amt(
                    rng.randint(0, est.input_tokens),
                    rng.randint(0, est.output_tokens),
                    rng.randint(0, int(est.usd * 4)) / 4,
                    1,
                )
                assert ledger.settle(step, scopes, actual) is True
                for s in scopes:
                    spent[s] = spent[s] + actual
            else:
                assert ledger.release(step, scopes) is True
        for s in limits:
            state = ledger.get(s)
            assert (state.spent, state.reserved) == (spent[s], reserved(s)), (n, s)


# --- rate limits --------------------------------------------------------------------
def test_rpm_allows_r_requests_per_window_then_says_how_long_to_wait(limiter):
    window = 30.0
    go = lambda: limiter.try_acquire(  # noqa: E731
        "p", "m", rpm=3, tpm=None, tokens=1, window_s=window
    )
    grants = [go(), go(), go()]
    assert all(g.granted for g in grants)
    refused = go()
    assert not refused.granted
    first_leaves_at = grants[0].server_time_us + window * 1e6
    assert refused.wait_s == pytest.approx((first_leaves_at - refused.server_time_us) / 1e6)
    assert 0 < refused.wait_s <= window
    # another model of the same provider has its own window
    assert limiter.acquire("p", "other", rpm=3, tpm=None, tokens=1, window_s=window) == 0.0


def test_tpm_counts_tokens_and_waits_for_enough_to_leave(limiter, r):
    window = 30.0
    go = lambda tokens: limiter.try_acquire(  # noqa: E731
        "p", "m", rpm=None, tpm=100, tokens=tokens, window_s=window
    )
    first, second = go(60), go(30)
    assert first.granted and second.granted
    assert go(0).granted
    refused = go(20)  # 90 + 20 > 100: the 60 must leave first
    assert refused.wait_s == pytest.approx(
        (first.server_time_us + window * 1e6 - refused.server_time_us) / 1e6
    )
    assert go(10).granted  # a smaller request still fits
    assert int(r.hget(rate_tokens("p", "m"), "tokens")) == 100
    assert r.zcard(keys.rate_limit("p", "m")) == 4


@pytest.mark.parametrize(("rpm", "tpm", "tokens"), [(1, None, 1), (None, 100, 100)])
def test_a_request_goes_once_the_window_has_moved_on(limiter, rpm, tpm, tokens):
    window = 0.3
    go = lambda: limiter.try_acquire(  # noqa: E731
        "p", "m", rpm=rpm, tpm=tpm, tokens=tokens, window_s=window
    )
    first = go()
    assert first.granted
    later = None

    def granted() -> bool:
        nonlocal later
        later = go()
        return later.granted

    wait_for(granted)
    assert later.server_time_us - first.server_time_us >= window * 1e6


def test_rpm_and_tpm_together_wait_for_the_later(limiter):
    go = lambda tokens: limiter.acquire(  # noqa: E731
        "p", "m", rpm=2, tpm=1000, tokens=tokens, window_s=5.0
    )
    assert go(10) == 0.0 and go(10) == 0.0
    assert go(10) > 0  # rpm bound
    assert limiter.acquire("p", "m2", rpm=10, tpm=50, tokens=50, window_s=5.0) == 0.0
    assert limiter.acquire("p", "m2", rpm=10, tpm=50, tokens=1, window_s=5.0) > 0  # tpm bound


def test_no_limits_means_go_unless_paused(limiter):
    assert limiter.acquire("p", "m", rpm=None, tpm=None, tokens=10**6) == 0.0
    limiter.pause("p", "m", 2.0)
    assert 0 < limiter.acquire("p", "m", rpm=None, tpm=None, tokens=1) <= 2.0


def test_pause_holds_the_whole_fleet_and_keeps_the_longer_pause(limiter, r):
    assert limiter.paused_for("p", "m") == 0.0
    assert limiter.pause("p", "m", 5.0) == 5.0
    assert limiter.pause("p", "m", 1.0) > 4.0  # a shorter Retry-After does not shorten it
    assert 4.0 < limiter.paused_for("p", "m") <= 5.0
    other_worker = RateLimiter(r)
    wait = other_worker.acquire("p", "m", rpm=100, tpm=None, tokens=1)
    assert 4.0 < wait <= 5.0
    assert other_worker.acquire("p", "other", rpm=100, tpm=None, tokens=1) == 0.0
    assert r.zcard(keys.rate_limit("p", "m")) == 0  # waiting counted nothing

    limiter.pause("p", "short", 0.05)
    wait_for(lambda: limiter.acquire("p", "short", rpm=1, tpm=None, tokens=1) == 0.0)
    assert limiter.paused_for("p", "short") == 0.0


def test_a_process_knows_its_own_pause_at_once_and_anothers_after_the_recheck(r):
    """What a step's begin script may skip reading (:meth:`Budgets.known_pauses`), and the
    pause the step then goes by (``rate_wait(..., None)``)."""
    from orchestration.core.agents import Agent
    from orchestration.services.budgeting import Budgets

    agent = Agent("x", model="sim:pause-test").spec
    key = keys.rate_pause(agent.provider, agent.model_name)
    mine, other = Budgets(r, pause_recheck_s=0.3), Budgets(r, pause_recheck_s=0.3)
    assert mine.known_pauses() == ()
    assert mine.rate_wait(agent, 1, 0.0) == 0.0 and other.rate_wait(agent, 1, 0.0) == 0.0
    assert mine.known_pauses() == (key,) == other.known_pauses()
    mine.pause(agent, 2.0)  # a 429: this process knows it without a read
    assert 1.9 < mine.rate_wait(agent, 1, None) <= 2.0
    assert other.rate_wait(agent, 1, None) == 0.0, "the other goes by what it read lately"
    wait_for(lambda: key not in other.known_pauses(), timeout=2.0)
    paused = other.rate_wait(agent, 1, mine.limiter.paused_for(agent.provider, agent.model_name))
    assert 0 < paused <= 2.0, "once stale it reads the pause again and obeys it"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rpm": 0, "tpm": None, "tokens": 1},
        {"rpm": -1, "tpm": None, "tokens": 1},
        {"rpm": 1.5, "tpm": None, "tokens": 1},
        {"rpm": None, "tpm": 0, "tokens": 0},
        {"rpm": None, "tpm": 10, "tokens": 11},
        {"rpm": None, "tpm": None, "tokens": -1},
        {"rpm": 1, "tpm": None, "tokens": 1, "window_s": 0},
    ],
)
def test_rate_limiter_bad_arguments(limiter, kwargs):
    with pytest.raises(ConfigError):
        limiter.acquire("p", "m", **kwargs)
