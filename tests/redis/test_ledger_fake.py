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
from orchestration.state.keys import budget_holds
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
    assert RateLimiter(decoded).try_acquire("p:m", rpm=1, tpm=None, tokens=1).granted


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
def slot_us(decision) -> int:
    """The server time (us) a decision's permit is booked for."""
    return decision.server_time_us + round(decision.wait_s * 1e6)


def test_requests_are_paced_smoothly_after_a_short_burst(limiter):
    """600 a minute is 10 a second, one every 100 ms: half a second's burst goes at once,
    every later request books the next slot, 100 ms after the one before."""
    go = lambda: limiter.try_acquire("p:m", rpm=600, tpm=None, tokens=1)  # noqa: E731
    decisions = [go() for _ in range(12)]
    assert all(d.booked for d in decisions)
    assert [d.granted for d in decisions[:5]] == [True] * 5
    assert not any(d.granted for d in decisions[5:])
    slots = [slot_us(d) for d in decisions[5:]]
    assert [b - a for a, b in zip(slots, slots[1:], strict=False)] == [100_000] * 6
    # another model (or endpoint) has its own limit
    assert limiter.try_acquire("p:m@http://other/v1", rpm=600, tpm=None, tokens=1).granted


def test_a_slot_beyond_the_horizon_is_not_booked(limiter, r):
    go = lambda: limiter.try_acquire(  # noqa: E731
        "p:m", rpm=60, tpm=None, tokens=1, burst_s=1.0, horizon_s=1.5
    )
    booked = [go() for _ in range(3)]  # now, +1 s (burst 1 s = one request), +2 s: no
    assert [d.booked for d in booked] == [True, True, False]
    assert booked[2].wait_s == pytest.approx(0.5, abs=0.05)  # until +2 s is within 1.5 s
    assert not go().booked, "a refusal books nothing"
    assert limiter.permits("p:m") == 2


def test_a_permit_given_back_frees_its_slot_once(limiter):
    go = lambda: limiter.try_acquire("p:m", rpm=60, tpm=None, tokens=1, burst_s=1.0)  # noqa: E731
    first, second = go(), go()
    assert first.granted and second.wait_s == pytest.approx(1.0, abs=0.05)
    assert limiter.give_back("p:m", second.permit) is True
    assert limiter.give_back("p:m", second.permit) is False, "given back once"
    again = go()
    assert slot_us(again) == slot_us(second), "the slot is booked again"
    assert limiter.permits("p:m") == 2


def test_a_refused_request_keeps_its_slot_but_not_its_tokens(limiter):
    """A 429 (settled at 0 tokens): the permit is no longer held and its tokens come back,
    but the request reached the vendor at its slot, which stays spent."""
    go = lambda: limiter.try_acquire(  # noqa: E731
        "p:m", rpm=60, tpm=6000, tokens=100, burst_s=0.0
    )
    assert go().granted
    second = go()
    assert second.wait_s == pytest.approx(1.0, abs=0.05)
    assert limiter.settle("p:m", second.permit, tokens=0)[0] is True
    assert limiter.permits("p:m") == 1
    third = go()
    assert slot_us(third) - slot_us(second) == pytest.approx(1_000_000, abs=2)


def test_tokens_are_charged_at_the_estimate_and_settled_at_the_real_usage(limiter):
    """6,000 tokens a minute is 100 a second: a 100-token estimate takes a second of the
    rate; settled at 10 real tokens, the next request's slot moves 0.9 s earlier."""
    go = lambda: limiter.try_acquire("p:m", rpm=None, tpm=6000, tokens=100, burst_s=0.0)  # noqa: E731
    first = go()
    assert first.granted
    second = go()
    assert second.wait_s == pytest.approx(1.0, abs=0.05)
    assert limiter.settle("p:m", first.permit, tokens=10) == (True, False)
    assert limiter.settle("p:m", first.permit, tokens=10)[0] is False, "settled once"
    third = go()
    assert slot_us(third) - slot_us(second) == pytest.approx(100_000, abs=2)


def test_requests_and_tokens_together_wait_for_the_later(limiter):
    go = lambda name, tokens: limiter.try_acquire(  # noqa: E731
        name, rpm=60, tpm=600, tokens=tokens, burst_s=0.0
    )
    assert go("p:rpm", 1).granted
    assert go("p:rpm", 1).wait_s == pytest.approx(1.0, abs=0.05)  # 1 s a request
    assert go("p:tpm", 30).granted
    assert go("p:tpm", 1).wait_s == pytest.approx(3.0, abs=0.05)  # 30 tokens: 3 s


def test_a_learned_limit_below_the_configured_one_wins(limiter):
    from orchestration.core.ratelimit import VendorLimits

    first = limiter.try_acquire("p:m", rpm=6000, tpm=None, tokens=1, burst_s=0.0)
    assert first.rpm == 6000
    limiter.settle("p:m", first.permit, tokens=1, learned=VendorLimits(rpm=60))
    paced = limiter.try_acquire("p:m", rpm=6000, tpm=None, tokens=1, burst_s=0.0)
    assert paced.rpm == 60
    # a configured limit below the learned one is kept: it is a choice
    assert limiter.try_acquire("p:m", rpm=30, tpm=None, tokens=1).rpm == 30


def test_an_unconfigured_limit_probes_until_the_vendor_answers(limiter):
    """Nothing configured, nothing learned: a couple of calls go and none is booked ahead;
    once the vendor answered without rate-limit headers the model is unpaced."""
    from orchestration.core.ratelimit import VendorLimits

    go = lambda: limiter.try_acquire("p:m", rpm=None, tpm=None, tokens=1, learn=True)  # noqa: E731
    probes = [go() for _ in range(3)]
    assert [p.granted for p in probes] == [True, True, False]
    assert not probes[2].booked and probes[2].wait_s > 0
    limiter.settle("p:m", probes[0].permit, tokens=1, learned=VendorLimits())
    free = go()
    assert free.granted and not free.booked
    assert not limiter.try_acquire("q:m", rpm=None, tpm=None, tokens=1).booked  # no learning


def test_a_fleet_pause_holds_every_request_and_a_long_retry_after_the_limit(limiter):
    limiter.pause("p:m", 2.0)
    paused = limiter.try_acquire("p:m", rpm=600, tpm=None, tokens=1)
    assert not paused.booked and 1.5 < paused.wait_s <= 2.0
    first = limiter.try_acquire("p:n", rpm=600, tpm=None, tokens=1)
    limiter.settle("p:n", first.permit, tokens=None, pause_s=3.0)
    after = limiter.try_acquire("p:n", rpm=600, tpm=None, tokens=1)
    assert after.booked and after.wait_s == pytest.approx(3.0, abs=0.05)


def test_pause_keeps_the_longer_pause(limiter):
    assert limiter.paused_for("p:m") == 0.0
    assert limiter.pause("p:m", 5.0) == 5.0
    assert limiter.pause("p:m", 1.0) > 4.0  # a shorter Retry-After does not shorten it
    assert 4.0 < limiter.paused_for("p:m") <= 5.0
    limiter.pause("p:short", 0.05)
    wait_for(lambda: limiter.try_acquire("p:short", rpm=1, tpm=None, tokens=1).granted)
    assert limiter.paused_for("p:short") == 0.0


def test_a_permit_of_a_dead_worker_lapses(limiter):
    held = limiter.try_acquire("p:m", rpm=600, tpm=None, tokens=1, hold_s=0.05)
    assert held.booked and limiter.permits("p:m") == 1
    wait_for(lambda: limiter.permits("p:m") == 0)


def test_a_process_knows_its_own_pause_at_once_and_anothers_after_the_recheck(r):
    """What a step's begin script may skip reading (:meth:`Budgets.known_pauses`), and the
    pause the step then goes by (``rate_permit(..., None, ...)``)."""
    from orchestration.core.agents import Agent
    from orchestration.services.budgeting import Budgets, rate_name

    agent = Agent("x", model="sim:pause-test").spec
    key = keys.rate_pause(rate_name(agent))
    mine, other = Budgets(r, pause_recheck_s=0.3), Budgets(r, pause_recheck_s=0.3)
    wait = lambda budgets, paused: budgets.rate_permit(agent, 1, paused, 60).wait_s  # noqa: E731
    assert mine.known_pauses() == ()
    assert wait(mine, 0.0) == 0.0 and wait(other, 0.0) == 0.0
    assert mine.known_pauses() == (key,) == other.known_pauses()
    mine.pause(agent, 2.0)  # a 429: this process knows it without a read
    assert 1.9 < wait(mine, None) <= 2.0
    assert wait(other, None) == 0.0, "the other goes by what it read lately"
    wait_for(lambda: key not in other.known_pauses(), timeout=2.0)
    paused = wait(other, mine.limiter.paused_for(rate_name(agent)))
    assert 0 < paused <= 2.0, "once stale it reads the pause again and obeys it"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rpm": 0, "tpm": None, "tokens": 1},
        {"rpm": -1, "tpm": None, "tokens": 1},
        {"rpm": 1.5, "tpm": None, "tokens": 1},
        {"rpm": None, "tpm": 0, "tokens": 0},
        {"rpm": None, "tpm": None, "tokens": -1},
        {"rpm": 1, "tpm": None, "tokens": 1, "window_s": 0},
    ],
)
def test_rate_limiter_bad_arguments(limiter, kwargs):
    with pytest.raises(ConfigError):
        limiter.try_acquire("p:m", **kwargs)
