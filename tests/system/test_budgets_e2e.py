"""Fleet-wide budgets end to end: real worker processes, real Redis, one shared cap."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest

from orchestration import Agent, Team
from orchestration.client.handles import store
from orchestration.core import events as ev
from orchestration.core.budget import Budget
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger
from tests.reliability import ENGINE, Reliability
from tests.support import celery_worker, client_pointed_at, wait_for

pytestmark = pytest.mark.system


def test_twenty_runs_share_a_5000_token_cap(
    worker: Any, client_on: str, system_redis_url: str
) -> None:
    name = f"cap-{uuid.uuid4().hex[:8]}"
    ledger = BudgetLedger(store().r)
    ledger.set_limits(f"global:{name}", Budget(max_tokens=5000, warn_at=0.5))
    team = Team.actor_critic(
        actor=Agent("Fix the code.", model="sim?latency_ms=30", max_tokens=300),
        critic=Agent("Review.", model="sim?scores=0.1&latency_ms=30", max_tokens=300),
        max_rounds=3,
        global_budgets=[name],
    )
    # A second worker process: the cap holds across processes, not just threads.
    with celery_worker(system_redis_url, name="budget2"):
        handles = [team.submit(f"Review snippet {i}: eval(input())") for i in range(20)]
        results = [h.result(timeout=120) for h in handles]
    spent = sum(r.usage.total.total_tokens for r in results)
    state = ledger.get(f"global:{name}")
    assert spent <= 5000
    assert state.spent.tokens == spent  # the ledger charged exactly what the runs used
    assert state.reserved.tokens == 0
    interrupted = [r for r in results if r.status == "interrupted"]
    assert interrupted, "a 5,000-token cap cannot hold 20 worst-case runs"
    # Stopped by the cap, or by an answer cut where the cap lowered max_tokens: the same reason.
    reasons = {r.interruption_reason for r in interrupted}
    assert reasons == {"budget:global:tokens"}
    warnings = [e for r in results for e in r.events if e.type == ev.BUDGET_WARNING]
    assert len(warnings) == 1
    assert warnings[0].data["scope"] == f"global:{name}"


def test_a_call_bigger_than_the_budget_runs_with_max_tokens_lowered(
    worker: Any, client_on: str
) -> None:
    """Each call's worst case (4,000 output tokens) is more than the whole run budget:
    the calls still go, asking for no more than the budget has left. The budget also holds
    the critic's input at one token a byte (no ratio learned yet on a fresh Redis)."""
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim", max_tokens=4000),
        critic=Agent("Review.", model="sim?scores=0.95", max_tokens=4000),
        max_rounds=1,
        budget=Budget(max_tokens=3000),
    )
    result = team.run_sync("print(1)", timeout=30)
    assert result.status == "approved", result.error
    assert result.usage.total.calls == 2
    assert result.usage.total.total_tokens <= 3000


def test_a_reply_cut_where_the_budget_lowered_max_tokens_names_the_budget(
    worker: Any, client_on: str
) -> None:
    """A 600-token draft, a run budget leaving room for about 250 output tokens: the
    call goes with ``max_tokens`` lowered, its reply is cut there, and the run reads
    ``budget:run:tokens`` — not ``actor:round_0:max_tokens``, which would blame the
    agent's own limit of 4,000."""
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim?words=400", max_tokens=4000),
        critic=Agent("Review.", model="sim?scores=0.95", max_tokens=4000),
        max_rounds=1,
        budget=Budget(max_tokens=400),
    )
    result = team.run_sync(f"print({uuid.uuid4().hex[:8]})", timeout=30)
    assert result.status == "interrupted", (result.status, result.error)
    assert result.interruption_reason == "budget:run:tokens"
    # the call did run, lowered, and was cut: one call, its partial draft kept
    assert result.usage.total.calls == 1
    assert result.usage.total.total_tokens <= 400
    assert result.output


def test_a_user_without_a_limit_holds_nothing_and_is_charged_exactly(
    worker: Any, client_on: str
) -> None:
    """A user scope with no limit: calls make no hold (nothing reserved, no lease, no
    settled marker) and the scope's spent counters get exactly what the runs used; once
    the user is given a limit, the next run's calls hold their worst case again."""
    user = f"free-{uuid.uuid4().hex[:8]}"
    scope = f"user:{user}"
    r = store().r
    ledger = BudgetLedger(r)
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim", max_tokens=300),
        critic=Agent("Review.", model="sim?scores=0.1", max_tokens=300),
        max_rounds=2,
    )
    results = [team.run_sync(f"print({i})", user_id=user, timeout=60) for i in range(2)]
    assert {x.status for x in results} == {"max_rounds_reached"}
    state = ledger.get(scope)
    used = [x.usage.total for x in results]
    assert state.spent.calls == sum(u.calls for u in used) == 10
    assert state.spent.input_tokens == sum(u.input_tokens for u in used)
    assert state.spent.output_tokens == sum(u.output_tokens for u in used)
    assert state.reserved.calls == 0 and state.open_reservations == 0
    assert r.exists(keys.budget_reservations(scope), keys.budget_holds(scope)) == 0
    markers = [k for run in results for k in r.scan_iter(keys.budget_settled(f"{run.run_id}*"))]
    assert markers == []

    # A limit on: the next run's calls hold first (the limit stops it at its first round).
    ledger.set_limits(scope, Budget(max_calls=state.spent.calls + 1))
    blocked = team.run_sync("print(2)", user_id=user, timeout=60)
    assert blocked.status == "interrupted", blocked.status
    assert blocked.interruption_reason == "budget:user:calls"
    assert ledger.get(scope).spent.calls == state.spent.calls + blocked.usage.total.calls


def test_run_budget_stops_at_the_start_of_a_round(worker: Any, client_on: str) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim"),
        critic=Agent("Review.", model="sim?scores=0.1"),
        max_rounds=3,
        budget=Budget(max_calls=3),
    )
    result = team.run_sync("print(1)", timeout=30)
    assert result.status == "interrupted"
    assert result.interruption_reason == "budget:run:calls"
    assert result.usage.total.calls == 3
    assert result.output is not None and result.output.startswith("[revision 1]")


def test_usd_budget_on_unpriced_model_is_refused_at_submit() -> None:
    from orchestration.core.errors import ConfigError

    with pytest.raises(ConfigError, match="price"):
        Team.actor_critic(
            actor=Agent("Fix.", model="openai:my-local-model", base_url="http://127.0.0.1:1/v1"),
            critic=Agent("Review.", model="sim"),
            budget=Budget(max_usd=1.0),
        )


# --- tests with their own workers on their own db (fresh per-process caches) -------------

ISOLATED_DB = int(os.environ.get("DUET_ISOLATED_REDIS_DB", "15"))


@pytest.fixture
def isolated_url(redis_url: str) -> Any:
    """An empty db of its own, with this process's client pointed at it."""
    import redis

    url = f"{redis_url.rpartition('/')[0]}/{ISOLATED_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    with client_pointed_at(url):
        yield url
    client.flushdb()
    client.close()


def test_rate_limit_holds_across_worker_processes(isolated_url: str, fake_llm: Any) -> None:
    """Two worker processes share one limit of 2 requests a second: at the vendor, any k + 1
    actor calls in a row span at least k - 1 intervals (a burst of one request), and the
    fleet used the rate instead of serialising; no permit is left held."""
    from orchestration.core.ratelimit import limit_name
    from orchestration.state.ratelimits import RateLimit, RateLimiter, set_rate_limits

    limit, window = 4, 2.0
    set_rate_limits(
        store().r,
        {"openai:sim": RateLimit(rpm=limit, window_s=window)},
        base_url=fake_llm.url,
    )
    team = Team.actor_critic(
        actor=Agent("Fix.", model="openai:sim", base_url=fake_llm.url),
        critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=fake_llm.url),
        max_rounds=1,
    )
    # Workers import the SDK at start, so no import sits between a grant and its request.
    env = {"OPENAI_API_KEY": "sk-test-not-a-secret", "DUET_PRELOAD_PROVIDERS": "openai"}
    start = fake_llm.stats()["requests"]
    with (
        celery_worker(isolated_url, env=env, name="rate1"),
        celery_worker(isolated_url, env=env, name="rate2"),
    ):
        handles = [team.submit(f"snippet {i}") for i in range(10)]
        results = [h.result(timeout=90) for h in handles]
    assert [r.status for r in results] == ["approved"] * 10
    stats = fake_llm.stats()
    assert stats["requests"] - start == 20
    arrivals = sorted(a["t"] for a in stats["arrivals"] if a["model"] == "sim")[-10:]
    interval = window / limit
    # Each arrival trails its slot by the worker's time to send it (its budget
    # reservation, the SDK, threads sharing one GIL): hence the allowance.
    for i in range(len(arrivals)):
        for j in range(i + 1, len(arrivals)):
            assert arrivals[j] - arrivals[i] >= (j - i - 1) * interval - 0.5, (i, j)
    assert arrivals[-1] - arrivals[0] < 10 * interval + window
    assert RateLimiter(store().r).permits(limit_name("openai", "sim", fake_llm.url)) == 0


def test_one_teams_limit_does_not_pace_another_endpoint(isolated_url: str, fake_llm: Any) -> None:
    """A limit is kept per model *and* endpoint: one team's ``rpm = 1`` for a model on its
    ``base_url`` leaves another team's batch on another ``base_url`` unpaced."""
    from orchestration.state.ratelimits import RateLimit, set_rate_limits

    theirs = fake_llm.url.replace("127.0.0.1", "localhost")
    set_rate_limits(store().r, {"openai:sim": RateLimit(rpm=1, source="team-a")}, base_url=theirs)
    team = Team.actor_critic(
        actor=Agent("Fix.", model="openai:sim", base_url=fake_llm.url),
        critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=fake_llm.url),
        max_rounds=1,
    )
    env = {"OPENAI_API_KEY": "sk-test-not-a-secret"}
    with celery_worker(isolated_url, env=env, name="teamb"):
        handles = [team.submit(f"snippet {i}") for i in range(4)]
        # paced at one a minute, the fourth would start three minutes from now
        results = [h.result(timeout=45) for h in handles]
    assert [r.status for r in results] == ["approved"] * 4


def test_vendor_429_pauses_the_whole_fleet(isolated_url: str, fake_llm: Any) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix.", model="openai:sim", base_url=fake_llm.url),
        critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=fake_llm.url),
        max_rounds=1,
    )
    # Every call reads the pause: the other worker must obey it at once, not within
    # DUET_PAUSE_RECHECK_S (see the next test for that).
    env = {
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "DUET_RETRY_BASE_S": "0.1",
        "DUET_PAUSE_RECHECK_S": "0",
    }
    fake_llm.set_faults(status=429, retry_after="2", times=1, model="sim")
    try:
        with (
            celery_worker(isolated_url, env=env, name="p1"),
            celery_worker(isolated_url, env=env, name="p2"),
        ):
            first = team.submit("the first snippet")
            wait_for(lambda: fake_llm.stats()["by_status"].get("429"), 30, "the 429")
            t429 = max(a["t"] for a in fake_llm.stats()["arrivals"] if a["model"] == "sim")
            others = [team.submit(f"snippet {i}") for i in range(6)]
            results = [h.result(timeout=60) for h in [first, *others]]
        assert [r.status for r in results] == ["approved"] * 7
        later = [
            a["t"] for a in fake_llm.stats()["arrivals"] if a["model"] == "sim" and a["t"] > t429
        ]
        assert len(later) == 7
        assert min(later) >= t429 + 2 - 0.05, "a worker called the paused model"
    finally:
        fake_llm.set_faults()


def test_another_process_pause_is_obeyed_once_the_recheck_interval_passed(
    isolated_url: str, fake_llm: Any
) -> None:
    """A worker that lately read "no pause" for a model trusts that for
    DUET_PAUSE_RECHECK_S; a pause set meanwhile by another process (here the test's) is
    obeyed once that has passed: no call reaches the vendor before the pause ends."""
    from orchestration.core.ratelimit import limit_name
    from orchestration.state.ratelimits import RateLimiter

    recheck_s, pause_s = 0.5, 2.0
    team = Team.actor_critic(
        actor=Agent("Fix.", model="openai:sim", base_url=fake_llm.url),
        critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=fake_llm.url),
        max_rounds=1,
    )
    env = {"OPENAI_API_KEY": "sk-test-not-a-secret", "DUET_PAUSE_RECHECK_S": str(recheck_s)}
    with celery_worker(isolated_url, env=env, name="recheck"):
        # The worker reads the model's pause (none) and remembers it.
        assert team.submit("a first snippet").result(timeout=60).status == "approved"
        paused_at = time.time()
        RateLimiter(store().r).pause(limit_name("openai", "sim", fake_llm.url), pause_s)
        time.sleep(recheck_s + 0.1)  # what it remembers is stale now
        result = team.submit("a second snippet").result(timeout=60)
    assert result.status == "approved"
    later = [
        a["t"] for a in fake_llm.stats()["arrivals"] if a["model"] == "sim" and a["t"] > paused_at
    ]
    assert len(later) == 1
    assert later[0] >= paused_at + pause_s - 0.05, "the worker called the paused model"


def test_dead_workers_reservation_is_charged_after_its_lease(
    isolated_url: str, fake_llm: Any, reliability: Reliability
) -> None:
    """kill -9 mid-call: the call may have been billed (the stand-in got it), so when the
    dead worker's hold runs out it is charged, in full, not released."""
    import signal

    team = Team.actor_critic(
        actor=Agent("Fix.", model="openai:sim", base_url=fake_llm.url),
        critic=Agent("Review.", model="openai:sim:critic", base_url=fake_llm.url),
        budget=Budget(max_tokens=100_000),
    )
    ledger = BudgetLedger(store().r)
    fake_llm.set_faults(latency_ms=20_000)
    try:
        env = {"OPENAI_API_KEY": "sk-test-not-a-secret", "DUET_STEP_LEASE_S": "5"}
        with celery_worker(isolated_url, env=env, name="doomed") as proc:
            before = fake_llm.stats()["requests"]
            handle = team.submit("a snippet")
            scope = f"run:{handle.run_id}"
            wait_for(lambda: ledger.get(scope).open_reservations == 1, 30, "the reservation")
            wait_for(lambda: fake_llm.stats()["requests"] > before, 30, "the call to arrive")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        held = ledger.get(scope).reserved.tokens
        assert held > 0
        state = wait_for(
            lambda: (s := ledger.get(scope)).open_reservations == 0 and s, 20, "the lease to expire"
        )
        served = fake_llm.stats()["requests"] - before
        uncharged = max(served - state.spent.calls, 0)
        reliability.record(
            section=ENGINE,
            fault="A worker killed (`SIGKILL`) with one call in flight (its run with a budget of "
            "its own), no other worker: its hold must be charged when its lease (5 s) runs out",
            load="1 run, 20 s call",
            lost=f"{'nothing' if uncharged == 0 else f'{uncharged} served calls uncharged'}: the "
            f"stand-in served {served} call(s); the budget charged {state.spent.calls} call(s) "
            f"and {state.spent.tokens:,} tokens (the hold was {held:,}); "
            f"{state.reserved.tokens} tokens still held",
            before="a dead worker's hold was released, so a call the vendor billed was charged "
            "nothing",
        )
        assert state.reserved.tokens == 0
        assert state.spent.tokens == held
        assert state.spent.calls == 1 == served
    finally:
        fake_llm.set_faults(latency_ms=0)
