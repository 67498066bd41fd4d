"""A batch's ``max_in_flight`` on a real Redis: the gate's scripts, the finish that gives a
place back, the coordinator that asks for one and passes it on, and the sweep.

Places are a set of run ids changed only by Lua scripts, so a race, a repeated ask or a
redelivered finish can neither exceed the cap nor lose a place.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from orchestration.core.agents import Agent
from orchestration.core.architecture import ActorCritic
from orchestration.services.coordinator import Coordinator
from orchestration.services.sweeper import Sweeper, Transition
from orchestration.state import keys
from orchestration.state.gates import BATCH_FIELD, BatchGate
from orchestration.state.runs import RunRecord, RunStore

pytestmark = pytest.mark.redis

BATCH = "b1"
FINISH = {"reason": None, "error": None, "usage": {}, "events": []}


@pytest.fixture
def r(decoding_client: Any) -> Any:
    return decoding_client


def _batch(store: RunStore, n: int, limit: int, *, placed: int | None = None) -> list[str]:
    """A batch of ``n`` runs with ``max_in_flight`` ``limit``, written as a submit writes
    it: the first ``placed`` (default ``limit``) runs hold a place, the rest wait."""
    loop = ActorCritic(actor=Agent("a", model="sim"), critic=Agent("c", model="sim"))
    spec_id = store.save_spec(loop.to_spec())
    ids = [f"run{i}" for i in range(n)]
    pipe = store.r.pipeline(transaction=False)
    store.create_runs([RunRecord(i, spec_id, "p", batch_id=BATCH, gate=limit) for i in ids], pipe)
    pipe.hset(keys.batch(BATCH), mapping={"total": n, "done": 0, BATCH_FIELD: limit})
    first = limit if placed is None else placed
    BatchGate.admit(pipe, BATCH, ids[:first], {i: n for n, i in enumerate(ids) if n >= first})
    pipe.execute()
    return ids


def _finish(store: RunStore, run_id: str) -> int:
    run = store.r.hgetall(keys.run(run_id))
    return store.record_finish(run, int(run.get("seq", 0)), "approved", **FINISH)


def test_concurrent_asks_never_exceed_the_cap(r: Any) -> None:
    gate = BatchGate(r)
    got: list[bool] = []
    start = threading.Barrier(40)

    def ask(n: int) -> None:
        start.wait()
        got.append(gate.enter(BATCH, f"run{n}", 5))

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got.count(True) == 5
    assert gate.in_flight(BATCH) == 5
    assert r.zcard(keys.batch_waiting(BATCH)) == 35


def test_a_repeated_ask_counts_once(r: Any) -> None:
    """A redelivered coordinator message (or one sent by the sweep) asks again."""
    gate = BatchGate(r)
    assert gate.enter(BATCH, "run0", 2) and gate.enter(BATCH, "run0", 2)
    assert gate.in_flight(BATCH) == 1
    assert gate.enter(BATCH, "run1", 2)
    assert not gate.enter(BATCH, "run2", 2)
    score = r.zscore(keys.batch_waiting(BATCH), "run2")
    assert not gate.enter(BATCH, "run2", 2)  # still waiting, once, in its first place
    assert r.zscore(keys.batch_waiting(BATCH), "run2") == score
    assert gate.in_flight(BATCH) == 2


def test_a_finish_gives_its_place_back_once(r: Any) -> None:
    store = RunStore(r)
    ids = _batch(store, 4, 2)
    gate = BatchGate(r)
    assert gate.in_flight(BATCH) == 2
    assert _finish(store, ids[0]) == 1
    assert gate.in_flight(BATCH) == 1
    assert _finish(store, ids[0]) != 1  # redelivered: not made again, frees nothing more
    assert gate.in_flight(BATCH) == 1
    assert r.sismember(keys.batch_gate(BATCH), ids[1])


def test_free_places_go_to_the_first_waiting_runs_once(r: Any) -> None:
    store = RunStore(r)
    ids = _batch(store, 6, 2)
    gate = BatchGate(r)
    assert gate.pass_on(BATCH, 2) == []  # full: nothing to hand on
    _finish(store, ids[0])
    _finish(store, ids[1])
    assert gate.pass_on(BATCH, 2) == ["run2", "run3"]  # in input order
    assert gate.pass_on(BATCH, 2) == []  # handed: not given twice
    assert gate.in_flight(BATCH) == 2
    assert gate.enter(BATCH, "run2", 2)  # its first transition finds its place


def test_concurrent_hand_ons_give_each_free_place_once(r: Any) -> None:
    store = RunStore(r)
    ids = _batch(store, 30, 10)
    for run_id in ids[:10]:
        _finish(store, run_id)
    gate = BatchGate(r)
    handed: list[str] = []
    start = threading.Barrier(8)

    def hand_on() -> None:
        start.wait()
        handed.extend(gate.pass_on(BATCH, 10))

    threads = [threading.Thread(target=hand_on) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(handed) == sorted(ids[10:20])
    assert gate.in_flight(BATCH) == 10


def test_the_coordinator_holds_a_run_back_and_a_finish_sends_the_next(r: Any) -> None:
    store = RunStore(r)
    ids = _batch(store, 3, 1)
    sent: list[tuple[str, int]] = []
    coordinator = Coordinator(store, send_transition=lambda run, seq: sent.append((run, seq)))
    assert coordinator.advance(ids[1], 0) is None  # no place: it waits, nothing recorded
    assert r.hget(keys.run(ids[1]), "status") == "queued"
    assert coordinator.advance(ids[0], 0) is not None  # holds the first place
    r.hset(keys.run(ids[0]), "cancelled", "1")  # finish it on its next transition
    run0 = r.hgetall(keys.run(ids[0]))
    assert coordinator.advance(ids[0], int(run0["seq"])) is None
    assert r.hget(keys.run(ids[0]), "status") == "cancelled"
    assert sent == [(ids[1], 0)]  # the freed place went on, with its message
    assert BatchGate(r).in_flight(BATCH) == 1
    # A redelivered finishing message passes on nothing more (the gate is full again).
    assert coordinator.advance(ids[0], int(run0["seq"])) is None
    assert sent == [(ids[1], 0)]
    assert coordinator.advance(ids[1], 0) is not None


def test_a_coordinator_lost_after_a_finish_leaks_no_place(r: Any) -> None:
    """The finish is made but its process dies before passing the place on: the
    redelivered message passes it on."""
    store = RunStore(r)
    ids = _batch(store, 2, 1)
    assert _finish(store, ids[0]) == 1  # made; the place is back, nobody told
    sent: list[tuple[str, int]] = []
    coordinator = Coordinator(store, send_transition=lambda run, seq: sent.append((run, seq)))
    assert coordinator.advance(ids[0], 0) is None  # the redelivery
    assert sent == [(ids[1], 0)]
    assert BatchGate(r).in_flight(BATCH) == 1


def test_the_sweep_hands_on_a_place_no_finish_handed_on(r: Any) -> None:
    """Waiting runs are out of the sweep's index; the sweep hands free places on."""
    store = RunStore(r)
    ids = _batch(store, 3, 1)
    assert r.zscore(keys.runs_moved(), ids[1]) is None  # waiting: not swept one by one
    later = time.time() + 101
    sends = Sweeper(store, after_s=100).sweep(now=later)
    # run0 holds the place (its message lost: sent again); run1, run2 wait for it.
    assert sends == [Transition(ids[0], 0, BATCH)]
    _finish(store, ids[0])  # its process dies before passing the place on
    sends = Sweeper(store, after_s=100).sweep(now=later + 1)
    assert sends == [Transition(ids[1], 0, BATCH)]  # one place free: the first in line
    assert r.zscore(keys.runs_moved(), ids[1]) is not None  # swept again if that is lost
    assert r.sismember(keys.gated_batches(), BATCH)  # run2 still waits
    _finish(store, ids[1])
    assert BatchGate(r).pass_on(BATCH, 1) == [ids[2]]
    assert not r.sismember(keys.gated_batches(), BATCH)  # nobody waits: forgotten
    # Handed a place but never sent (as if lost): the sweep's index has it.
    assert Sweeper(store, after_s=100).sweep(now=later + 2) == [Transition(ids[2], 0, BATCH)]


def test_a_run_that_parks_leaves_the_sweeps_index(r: Any) -> None:
    """A run sent while the gate is full (by resume, say) waits without being swept."""
    store = RunStore(r)
    ids = _batch(store, 2, 1, placed=1)
    gate = BatchGate(r)
    r.zadd(keys.runs_moved(), {ids[1]: 1.0})  # as resume's touch puts it back
    assert not gate.enter(BATCH, ids[1], 1)
    assert r.zscore(keys.runs_moved(), ids[1]) is None
    assert r.sismember(keys.gated_batches(), BATCH)


def test_a_run_resume_reopens_asks_for_a_place_again(r: Any) -> None:
    """A cancelled run gave its place back: re-opened, it waits in line behind the runs
    queued at submit, and is sent on at the transition it stopped at."""
    store = RunStore(r)
    ids = _batch(store, 3, 1)
    sent: list[tuple[str, int]] = []
    coordinator = Coordinator(store, send_transition=lambda run, seq: sent.append((run, seq)))
    gate = BatchGate(r)
    assert coordinator.advance(ids[0], 0) is not None  # run0 holds the place, one step made
    r.hset(keys.run(ids[0]), "cancelled", "1")
    assert coordinator.advance(ids[0], 1) is None  # cancelled: its place goes to run1
    assert sent == [(ids[1], 0)]
    assert coordinator.advance(ids[1], 0) is not None
    what, seq, _ = store.resume_point(ids[0])  # `duet resume` re-opens run0
    assert (what, seq) == ("step", 1)  # its draft never stored: to be sent again
    assert not gate.reenter(ids[0])  # the gate is full: it waits, behind run2
    assert gate.in_flight(BATCH) == 1
    assert gate.reenter(ids[1])  # a run holding its place goes on
    for run_id in (ids[1], ids[2]):  # each finishes; the next in line is sent on
        r.hset(keys.run(run_id), "cancelled", "1")
        assert coordinator.advance(run_id, int(r.hget(keys.run(run_id), "seq"))) is None
    assert sent == [(ids[1], 0), (ids[2], 0), (ids[0], 1)]
    again = coordinator.advance(ids[0], 1)  # at the transition it stopped at: its draft
    assert again is not None and again.step_key == r.hget(keys.run(ids[0]), "current_step")
    assert gate.in_flight(BATCH) == 1


def test_a_run_without_a_batch_cap_resumes_at_once(r: Any) -> None:
    store = RunStore(r)
    pipe = r.pipeline(transaction=False)
    store.create_runs([RunRecord("solo", "spec", "p")], pipe)
    pipe.execute()
    assert BatchGate(r).reenter("solo")
    assert not r.exists(keys.batch_waiting(BATCH))
