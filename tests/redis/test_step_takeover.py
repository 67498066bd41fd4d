"""A step claimed by a dead worker process is taken over at once, on a real server.

A claim names its process; the process keeps a liveness key with a short TTL. A delivery
(or a resume, or the sweep) that finds the step claimed takes it over when that key is
gone — atomically with the check, so a claim that changed meanwhile, or whose process is
alive, is left; and not right after a Redis outage (every key lapsed at once: the fleet
must have been saying it is alive for a whole TTL first) — and the dead call's budget hold
is charged, not released.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestration.core.budget import Amount, Budget
from orchestration.services.liveness import Liveness
from orchestration.services.sweeper import Healer, Healing, Sweeper
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger
from orchestration.state.processes import (
    mark_alive,
    new_claimant,
    new_process_id,
    note_held,
    process_of,
    redis_ms,
)
from orchestration.state.runs import RunRecord, RunStore

KEY = "r0.generate"
TTL_S = 10


def _fleet_alive_for(client: Any, seconds: float) -> None:
    """The fleet's processes have been renewing their keys for ``seconds`` now."""
    client.set(keys.processes_since(), int((time.time() - seconds) * 1000), ex=60)


@pytest.fixture
def store(redis_client: Any, redis_url: str) -> Iterator[RunStore]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield RunStore(client, finished_ttl_s=600)
    client.close()


def _running(store: RunStore, run_id: str) -> None:
    pipe = store.r.pipeline()
    store.create_runs([RunRecord(run_id, "spec", "p", batch_id="b1")], pipe)
    pipe.execute()
    run = store.r.hgetall(keys.run(run_id))
    assert store.record_step(run, 0, KEY, {"prompt": "p", "pause": "x"}, []) == 1


def test_claims_name_their_process() -> None:
    process_id = new_process_id()
    claim = new_claimant(process_id)
    assert process_of(claim) == process_id
    assert new_claimant(process_id) != claim
    # A claim made by an older worker (task id and a random part) names no process.
    assert process_of("0c5b2f0e-4d1a-4c43-9f0b-6a1d2e3f4a5b:1a2b3c4d5e6f") is None
    assert process_of("local") is None


def test_a_dead_process_claim_is_taken_over_at_once(store: RunStore) -> None:
    _running(store, "r1")
    _fleet_alive_for(store.r, TTL_S + 1)
    dead, live = new_process_id(), new_process_id()
    mark_alive(store.r, live, 30)
    held = new_claimant(dead)
    assert store.begin_step("r1", KEY, held, 300, "{}").outcome == "go"

    mine = new_claimant(live)
    found = store.begin_step("r1", KEY, mine, 300, "{}")
    assert (found.outcome, found.holder) == ("busy", held)
    # A stale view of the claim takes nothing.
    assert not store.take_over("r1", KEY, new_claimant(dead), mine, 300, TTL_S)
    assert store.take_over("r1", KEY, held, mine, 300, TTL_S)
    assert store.r.get(keys.step_claim("r1", KEY)) == mine
    assert store.begin_step("r1", KEY, mine, 300, "{}").outcome == "go"
    # Now a live process holds it: nobody takes it over.
    other = new_claimant(new_process_id())
    found = store.begin_step("r1", KEY, other, 300, "{}")
    assert (found.outcome, found.holder) == ("busy", mine)
    assert not store.take_over("r1", KEY, mine, other, 300, TTL_S)
    assert store.r.get(keys.step_claim("r1", KEY)) == mine


def test_a_claim_naming_no_process_waits_for_its_lease(store: RunStore) -> None:
    _running(store, "r2")
    old = "0c5b2f0e-4d1a-4c43-9f0b-6a1d2e3f4a5b:1a2b3c4d5e6f"
    assert store.begin_step("r2", KEY, old, 300, "{}").outcome == "go"
    mine = new_claimant(new_process_id())
    assert store.begin_step("r2", KEY, mine, 300, "{}").outcome == "busy"
    assert not store.take_over("r2", KEY, old, mine, 300, TTL_S)


def test_no_claim_is_presumed_dead_right_after_a_redis_outage(store: RunStore) -> None:
    _running(store, "r3")
    held = new_claimant(new_process_id())  # its key lapsed, as every key in an outage
    assert store.begin_step("r3", KEY, held, 300, "{}").outcome == "go"
    mine = new_claimant(new_process_id())
    store.r.delete(keys.processes_since())  # no sign of life from anyone since
    assert not store.take_over("r3", KEY, held, mine, 300, TTL_S)
    _fleet_alive_for(store.r, TTL_S - 2)  # back, but not for a whole TTL yet
    assert not store.take_over("r3", KEY, held, mine, 300, TTL_S)
    _fleet_alive_for(store.r, TTL_S)
    assert store.take_over("r3", KEY, held, mine, 300, TTL_S)


def test_signs_of_life_keep_the_fleets_run_going(store: RunStore) -> None:
    store.r.delete(keys.processes_since())
    first, second = new_process_id(), new_process_id()
    mark_alive(store.r, first, TTL_S)
    since = store.r.get(keys.processes_since())
    assert abs(int(since) / 1000 - time.time()) < 5
    mark_alive(store.r, second, TTL_S)
    assert store.r.get(keys.processes_since()) == since  # the run goes on
    # Its TTL is half a process's: in an outage it lapses before any process key can.
    assert 0 < store.r.pttl(keys.processes_since()) <= TTL_S * 1000 // 2
    assert store.r.pttl(keys.process(second)) > TTL_S * 1000 // 2


def test_the_liveness_key_lives_while_its_process_renews_it(store: RunStore) -> None:
    liveness = Liveness(store.r, ttl_s=2)
    process_id = liveness.process_id
    try:
        assert process_of(liveness.claimant()) == process_id
        deadline = time.monotonic() + 3.5  # past the TTL: renewed meanwhile
        while time.monotonic() < deadline:
            assert store.r.exists(keys.process(process_id))
            time.sleep(0.2)
    finally:
        liveness.stop()
    deadline = time.monotonic() + 5
    while store.r.exists(keys.process(process_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not store.r.exists(keys.process(process_id))


def test_the_sweep_sends_on_a_step_whose_claim_names_a_dead_process(store: RunStore) -> None:
    _running(store, "dead-holder")
    _running(store, "live-holder")
    live = new_process_id()
    mark_alive(store.r, live, 30)
    assert (
        store.begin_step("dead-holder", KEY, new_claimant(new_process_id()), 300, "{}").outcome
        == "go"
    )
    assert store.begin_step("live-holder", KEY, new_claimant(live), 300, "{}").outcome == "go"

    sends = Sweeper(store, after_s=100).sweep(now=time.time() + 101)

    assert [s.run_id for s in sends] == ["dead-holder"]


def test_a_dead_calls_hold_is_charged(store: RunStore) -> None:
    ledger = BudgetLedger(store.r)
    ledger.set_limits("run:x", Budget(max_tokens=10_000))
    held = Amount(input_tokens=100, output_tokens=400, calls=1)
    assert ledger.reserve("x|r0.generate:dead", ["run:x"], held, 300) is None

    assert ledger.charge_hold("x|r0.generate:dead", ["run:x"])

    assert ledger.reserve("x|r0.critique:live", ["run:x"], held, 300) is None
    ledger.settle("x|r0.critique:live", ["run:x"], Amount(input_tokens=90, calls=1))
    state = ledger.get("run:x")
    assert (state.spent.tokens, state.spent.calls) == (590, 2)
    assert state.lapsed == held, "the part of spent charged at a hold, told apart"
    assert state.reserved.tokens == 0 and state.open_reservations == 0
    assert not ledger.charge_hold("x|r0.generate:dead", ["run:x"])  # once
    ledger.reset("run:x")
    assert ledger.get("run:x").lapsed == Amount()
    store.r.delete(*keys.budget_keys("run:x"))


def test_a_dead_process_is_noticed_once_and_its_claimed_steps_sent_on(store: RunStore) -> None:
    """The healer: a process whose liveness key lapsed is reported to one caller only,
    with the messages it held and the steps it had claimed; a live process's are left."""
    dead, live = new_process_id(), new_process_id()
    for process_id in (dead, live):
        mark_alive(store.r, process_id, TTL_S)
        note_held(store.r, process_id, {f"tag-{process_id}": "r9"}, 60)
    for run_id, process_id in (("r0", dead), ("r1", live)):
        _running(store, run_id)
        start = store.begin_step(run_id, KEY, new_claimant(process_id), 60, "{}")
        assert start.outcome == "go"
    healer = Healer(store, process_ttl_s=TTL_S)
    assert not healer.heal().dead  # both alive
    store.r.delete(keys.process(dead))
    store.r.zadd(keys.processes(), {dead: (time.time() - TTL_S - 1) * 1000})
    store.r.delete(keys.processes_since())  # right after an outage: nobody is presumed dead
    assert not healer.heal().dead
    _fleet_alive_for(store.r, TTL_S + 1)
    healing = healer.heal()
    assert healing.dead == [dead]
    assert healing.held == {f"tag-{dead}": "r9"}
    assert [(s.run_id, s.step_key) for s in healing.steps] == [("r0", KEY)]
    # A message of the run put back: its step is not sent a second time.
    assert healing.rest(set()) == healing.steps
    assert Healing([dead], {"t": "r0"}, healing.steps).rest({"t"}) == []
    assert not healer.heal().dead  # noticed once
    assert store.r.exists(keys.process_held(live))


def test_a_cancelled_retry_lets_go_of_the_claim_it_was_handed(store: RunStore) -> None:
    """A delivery that re-scheduled itself (waiting for a permit, a pause) hands its claim
    to the retry; when the run was cancelled meanwhile, the retry frees it, so the step a
    resume sends goes at once instead of finding it busy for a lease (it waited 60 s)."""
    _running(store, "r1")
    process = new_process_id()
    mark_alive(store.r, process, 30)
    first = new_claimant(process)
    assert store.begin_step("r1", KEY, first, 300, "{}").outcome == "go"
    assert store.cancel_run("r1")
    retry = new_claimant(process)
    assert store.begin_step("r1", KEY, retry, 300, "{}", previous=first).outcome == "cancelled"
    assert not store.r.exists(keys.step_claim("r1", KEY))
    # Another delivery's live claim is not this one's to free.
    other = new_claimant(process)
    store.r.set(keys.step_claim("r1", KEY), other, ex=300)
    assert store.begin_step("r1", KEY, new_claimant(process), 300, "{}").outcome == "cancelled"
    assert store.r.get(keys.step_claim("r1", KEY)) == other


def test_orphans_are_looked_for_once_every_live_process_noted_what_it_holds(
    store: RunStore,
) -> None:
    """After a death found at ``found``: no answer while a live process has not said it is
    alive since (its note may miss what it took); then the tags every process notes it
    holds, and a cut-off a third of a TTL before the death was found."""
    live, lapsed_ = new_process_id(), new_process_id()
    for process_id in (live, lapsed_):
        mark_alive(store.r, process_id, TTL_S)
        note_held(store.r, process_id, {f"tag-{process_id}": "r9"}, 60)
    store.r.delete(keys.process(lapsed_))  # dead, not yet found: does not hold it up
    healer = Healer(store, process_ttl_s=TTL_S)
    found = redis_ms(store.r) - 1
    store.r.zadd(keys.processes(), {live: found - 1000})  # its last beat before the death
    assert healer.orphans(found) is None
    mark_alive(store.r, live, TTL_S)  # a beat after it (its note written with it)
    held, before = healer.orphans(found) or (set(), 0.0)
    assert held == {f"tag-{live}", f"tag-{lapsed_}"}
    assert before == found / 1000 - TTL_S / 3
    store.r.delete(keys.process(live), keys.processes(), *map(keys.process_held, (live, lapsed_)))
