"""The run store's folded round trips on a real server: scripts run together in one
pipeline (a script the server forgot is loaded and run again), the begin script reads
what the step input names, and the coordinator's compact read falls back to the whole
steps when a step was stored without its outcome."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestration.state import keys
from orchestration.state.events import event_json
from orchestration.state.runs import Outgoing, RunStore, step_outcome, stored_result
from orchestration.state.scripts import ScriptCall, run_scripts


@pytest.fixture
def client(redis_client: Any, redis_url: str) -> Iterator[Any]:
    """A decoding client (as the store uses) on the emptied test db."""
    decoded = redis.Redis.from_url(redis_url, decode_responses=True)
    yield decoded
    decoded.close()


def _running(store: RunStore, run_id: str, step_input: dict[str, Any]) -> None:
    r = store.r
    r.hset(
        keys.run(run_id),
        mapping={
            "run_id": run_id,
            "spec_id": "s",
            "status": "running",
            "seq": 1,
            "current_step": "r0.generate",
        },
    )
    r.hset(keys.run_inputs(run_id), "r0.generate", json.dumps(step_input))


def test_scripts_in_one_pipeline_load_a_script_the_server_lacks(client: Any) -> None:
    store = RunStore(client, finished_ttl_s=60)
    _running(store, "fold1", {"phase": "generate", "round": 0, "prompt": "p"})
    # A script never loaded on this server: its EVALSHA in the pipeline gets NOSCRIPT.
    probe = client.register_script(f"-- {uuid.uuid4()}\nreturn redis.call('INCR', KEYS[1])")
    counter = f"{keys.PREFIX}:test:fold1:counter"
    try:
        stored = store.complete_step(
            "fold1",
            "r0.generate",
            {"key": "r0.generate", "text": "t", "calls": 1},
            "{}",
            "me",
            before=[ScriptCall(probe, [counter], [])],
        )
        assert stored is True
        assert client.get(counter) == "1"
        out = run_scripts(client, [ScriptCall(probe, [counter], [])] * 2)
        assert out == [2, 3]
        fresh = client.register_script(f"-- {uuid.uuid4()}\nreturn redis.call('INCR', KEYS[1])")
        assert run_scripts(client, [ScriptCall(fresh, [counter], [])] * 2) == [4, 5]
    finally:
        client.delete(counter, *keys.run_keys("fold1"))


def test_begin_reads_pause_and_history_and_marks_dispatched(client: Any) -> None:
    store = RunStore(client, finished_ttl_s=60)
    conv = f"{keys.PREFIX}:conv:actor:run:fold2"
    pause = f"{keys.PREFIX}:pause:test:fold2"
    _running(
        store,
        "fold2",
        {"phase": "generate", "round": 0, "prompt": "p", "pause": pause, "conv": conv, "turns": 2},
    )
    try:
        client.rpush(conv, "t1", "t2", "t3")
        client.set(pause, "1", px=5000)
        start = store.begin_step("fold2", "r0.generate", "me", 60, "{}")
        assert start.outcome == "go"
        assert start.history == ["t2", "t3"]
        assert start.paused_s is not None and 4 < start.paused_s <= 5
        assert client.hget(keys.run("fold2"), "dispatched") == "1"
    finally:
        client.delete(conv, pause, *keys.run_keys("fold2"))
        client.delete(keys.step_claim("fold2", "r0.generate"))


def test_begin_without_a_conversation_or_a_pause(client: Any) -> None:
    store = RunStore(client, finished_ttl_s=60)
    pause = keys.rate_pause("sim:fold3")
    _running(store, "fold3", {"phase": "generate", "round": 0, "prompt": "p", "pause": pause})
    try:
        start = store.begin_step("fold3", "r0.generate", "me", 60, "{}")
        assert start.outcome == "go"
        assert start.history is None and start.paused_s == 0.0
        client.set(pause, "1", px=5000)
        client.delete(keys.step_claim("fold3", "r0.generate"))
        paused = store.begin_step("fold3", "r0.generate", "me", 60, "{}").paused_s
        assert 4.0 < paused <= 5.0
    finally:
        client.delete(*keys.run_keys("fold3"), keys.step_claim("fold3", "r0.generate"), pause)


def _pttl_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_pttl", {}).get("calls", 0))


def test_begin_skips_the_pause_read_of_a_known_key_only(client: Any) -> None:
    """A pause key among ``known_pauses`` is not read (no PTTL; ``paused_s`` None, even
    with a pause there); any other is."""
    store = RunStore(client, finished_ttl_s=60)
    pause = keys.rate_pause("sim:fold12")
    _running(store, "fold12", {"phase": "generate", "round": 0, "prompt": "p", "pause": pause})
    claim = keys.step_claim("fold12", "r0.generate")
    try:
        client.set(pause, "1", px=5000)
        before = _pttl_calls(client)
        start = store.begin_step(
            "fold12",
            "r0.generate",
            "me",
            60,
            "{}",
            known_pauses=(keys.rate_pause("sim:other"), pause),
        )
        assert start.outcome == "go" and start.paused_s is None
        assert _pttl_calls(client) == before, "the known pause key was read"
        client.delete(claim)
        start = store.begin_step(
            "fold12", "r0.generate", "me", 60, "{}", known_pauses=(keys.rate_pause("sim:other"),)
        )
        assert start.paused_s is not None and 4.0 < start.paused_s <= 5.0
        assert _pttl_calls(client) == before + 1
    finally:
        client.delete(*keys.run_keys("fold12"), claim, pause)


def test_transition_read_is_compact_and_falls_back_to_whole_steps(client: Any) -> None:
    store = RunStore(client, finished_ttl_s=60)
    _running(store, "fold4", {"phase": "generate", "round": 0, "prompt": "p"})
    result = {"key": "r0.generate", "text": "draft", "interrupted": None, "calls": 1}
    try:
        store.complete_step("fold4", "r0.generate", result, "{}", "me")
        # The store leaves the record alone; the transition reads the step whole and
        # notes its outcome in the record with the next step.
        assert client.hget(keys.run("fold4"), "o:r0.generate") is None
        view = store.load_for_transition("fold4", ("r0.generate",))
        assert view.steps["r0.generate"]["text"] == "draft"
        assert view.unnoted == ("r0.generate",)
        run = client.hgetall(keys.run("fold4"))
        noted = {k: view.steps[k] for k in view.unnoted}
        assert store.record_step(run, 1, "r1.critique", {"prompt": "c"}, [], noted) == 1
        assert client.hget(keys.run("fold4"), "o:r0.generate") == step_outcome(result)
        client.hset(
            keys.run_steps("fold4"),
            "r1.critique",
            json.dumps({"key": "r1.critique", "text": "ok", "score": 0.5}),
        )
        view = store.load_for_transition("fold4", ("r1.critique", "r0.generate"))
        assert view.unnoted == ("r1.critique",)
        assert view.steps["r0.generate"]["text"] == "draft"
        view = store.load_for_transition("fold4", ("r1.critique",))
        assert view.steps["r0.generate"] == {
            "interrupted": None,
            "cached_input_tokens": 0,
            "cache_write_tokens": 0,
            "calls": 1,
        }
        assert not any(f.startswith(("o:", "in:")) for f in view.run)
        # Transition 2 made and a step's outcome neither in the record nor read whole (a
        # cancelled run's, or a redelivered message): every step is read whole.
        view = store.load_for_transition("fold4", ())
        assert view.steps["r1.critique"]["score"] == 0.5
        assert view.steps["r0.generate"]["text"] == "draft"
    finally:
        client.delete(*keys.run_keys("fold4"), keys.step_claim("fold4", "r0.generate"))


def _finish(store: RunStore, run_id: str, status: str, outcomes: tuple[str, ...]) -> None:
    run = store.r.hgetall(keys.run(run_id))
    made = store.record_finish(
        run,
        int(run["seq"]),
        status,
        reason=None,
        error=None,
        usage={"calls": 1},
        events=[event_json("run.finished", run_id, status=status)],
        outcomes=outcomes,
    )
    assert made == 1


def test_a_finish_compacts_what_only_a_moving_run_reads(client: Any) -> None:
    """A finished run drops its steps' outcomes from the record and keeps its events in a
    stream sized to them (a fresh stream's node is allocated for 4 kB); a cancelled run,
    which may be resumed, keeps its outcomes. Events are stored without the run's id and
    time and read back with them."""
    store = RunStore(client, finished_ttl_s=60)
    result = {"key": "r0.generate", "text": "draft", "interrupted": None, "calls": 1}
    try:
        for run_id in ("fold5", "fold6"):
            _running(store, run_id, {"phase": "generate", "round": 0, "prompt": "p"})
            store.add_event(run_id, event_json("run.started", run_id))
            done = event_json("actor_critic.actor_completed", run_id, 0, phase="draft")
            assert store.complete_step(run_id, "r0.generate", result, done, "me")
        entry_id, fields = client.xrange(keys.run_events("fold5"))[0]
        raw = fields["e"]
        # Neither the run's id (the stream's) nor a time (the entry id's) is stored.
        assert "fold5" not in raw and json.loads(raw) == {"type": "run.started"}
        first = store.events("fold5")[0][1]
        assert first.run_id == "fold5" and first.ts == int(entry_id.split("-")[0]) / 1000
        before = client.memory_usage(keys.run_events("fold5"), samples=0)

        for run_id in ("fold5", "fold6"):  # as the transition after the step notes it
            client.hset(keys.run(run_id), "o:r0.generate", step_outcome(result))
        _finish(store, "fold5", "approved", ("r0.generate",))
        _finish(store, "fold6", "cancelled", ())

        assert client.hget(keys.run("fold5"), "o:r0.generate") is None
        assert client.hget(keys.run("fold6"), "o:r0.generate") == step_outcome(result)
        after = client.memory_usage(keys.run_events("fold5"), samples=0)
        assert after < before / 2, (before, after)
        assert 0 < client.ttl(keys.run_events("fold5")) <= 60
        events = store.events("fold5")
        types = ["run.started", "actor_critic.actor_completed", "run.finished"]
        assert [e.type for _, e in events] == types
        assert {e.run_id for _, e in events} == {"fold5"}
        assert events[0][1].round is None and events[0][1].data == {}
        assert events[1][1].round == 0 and events[1][1].data == {"phase": "draft"}
        assert events[2][1].data == {"status": "approved"}
        got = store.result("fold5")
        assert got.status == "approved" and got.output == "draft"
        assert [e.type for e in got.events] == types
    finally:
        client.delete(*keys.run_keys("fold5"), *keys.run_keys("fold6"))


def test_storing_a_step_frees_its_claim_whoever_holds_it(client: Any) -> None:
    """Once a step is stored every claim on it is moot (a delivery finds it done first):
    the store deletes the claim even when another delivery holds it."""
    store = RunStore(client, finished_ttl_s=60)
    pause = keys.rate_pause("sim:fold7")
    _running(store, "fold7", {"phase": "generate", "round": 0, "prompt": "p", "pause": pause})
    result = {"key": "r0.generate", "text": "draft", "interrupted": None, "calls": 1}
    claim = keys.step_claim("fold7", "r0.generate")
    try:
        assert store.begin_step("fold7", "r0.generate", "other", 60, "{}").outcome == "go"
        assert store.complete_step("fold7", "r0.generate", result, "{}", "me")
        assert client.exists(claim) == 0
        client.set(claim, "late", ex=60)  # a claim made meanwhile is moot too
        assert store.begin_step("fold7", "r0.generate", "third", 60, "{}").outcome == "done"
    finally:
        client.delete(*keys.run_keys("fold7"), claim)


def test_a_step_input_lives_in_the_record_until_the_finish(client: Any) -> None:
    """The transition writes the step's input as a field of the record (no inputs hash),
    the begin script reads it with the record, and the finish drops it."""
    store = RunStore(client, finished_ttl_s=60)
    pause = keys.rate_pause("sim:fold8")
    client.hset(
        keys.run("fold8"), mapping={"run_id": "fold8", "spec_id": "s", "status": "queued", "seq": 0}
    )
    step_input = {"phase": "generate", "round": 0, "prompt": "p", "pause": pause}
    try:
        run = client.hgetall(keys.run("fold8"))
        assert store.record_step(run, 0, "r0.generate", step_input, []) == 1
        assert json.loads(client.hget(keys.run("fold8"), "in:r0.generate")) == step_input
        assert client.exists(keys.run_inputs("fold8")) == 0
        start = store.begin_step("fold8", "r0.generate", "me", 60, "{}")
        assert start.outcome == "go" and start.input == step_input
        result = {"key": "r0.generate", "text": "draft", "interrupted": None, "calls": 1}
        assert store.complete_step("fold8", "r0.generate", result, "{}", "me")
        assert "in:r0.generate" not in store.load_for_transition("fold8", ()).run
        _finish(store, "fold8", "approved", ("r0.generate",))
        left = client.hkeys(keys.run("fold8"))
        assert not [f for f in left if f.startswith(("in:", "o:"))], left
    finally:
        client.delete(*keys.run_keys("fold8"), keys.step_claim("fold8", "r0.generate"))


def test_a_conversation_ttl_is_renewed_by_a_runs_first_turns_only(client: Any) -> None:
    store = RunStore(client, finished_ttl_s=60)
    conv = f"{keys.PREFIX}:conv:actor:user:fold9"
    _running(store, "fold9", {"phase": "generate", "round": 0, "prompt": "p"})
    result = {"key": "k", "text": "t", "interrupted": None, "calls": 1}
    try:
        client.rpush(conv, "earlier")
        client.expire(conv, 1000)
        later = {**result, "key": "r2.refine"}
        assert store.complete_step(
            "fold9", "r2.refine", later, "{}", "me", conversation=(conv, "t2", 10)
        )
        assert client.ttl(conv) > 60  # left as it was
        first = {**result, "key": "r1.critique"}
        assert store.complete_step(
            "fold9", "r1.critique", first, "{}", "me", conversation=(conv, "t1", 10)
        )
        assert 0 < client.ttl(conv) <= 60
        client.delete(conv)
        assert store.complete_step(
            "fold9",
            "r3.refine",
            {**result, "key": "r3.refine"},
            "{}",
            "me",
            conversation=(conv, "t3", 10),
        )
        assert 0 < client.ttl(conv) <= 60  # a new list always gets it
    finally:
        client.delete(conv, *keys.run_keys("fold9"))


def test_a_runs_own_conversation_is_read_from_its_earlier_steps(client: Any) -> None:
    """A step whose conversation is the run's own gets, from its begin script, the run's
    earlier steps of its role (input and stored result): the last ``turns`` of them."""
    store = RunStore(client, finished_ttl_s=60)
    pause = keys.rate_pause("sim:fold10")
    client.hset(
        keys.run("fold10"),
        mapping={"run_id": "fold10", "spec_id": "s", "status": "queued", "seq": 0},
    )
    try:
        for seq, key in enumerate(("r0.generate", "r1.critique", "r1.refine")):
            run = client.hgetall(keys.run("fold10"))
            meta = {"prompt": f"p-{key}", "pause": pause, "own": 1, "turns": 1}
            assert store.record_step(run, seq, key, meta, []) == 1
            result = {"key": key, "text": f"t-{key}", "interrupted": None, "calls": 1}
            assert store.complete_step("fold10", key, result, "{}", "me")
        run = client.hgetall(keys.run("fold10"))
        meta = {"prompt": "p", "pause": pause, "own": 1, "turns": 1}
        assert store.record_step(run, 3, "r2.critique", meta, []) == 1
        start = store.begin_step(
            "fold10", "r2.refine", "me", 60, "{}", earlier=("r0.generate", "r1.refine")
        )
        assert start.outcome == "gone"  # not the current step's input: nothing recorded
        start = store.begin_step("fold10", "r2.critique", "me", 60, "{}", earlier=("r1.critique",))
        assert start.outcome == "go" and start.history is None
        assert start.own is not None and [k for k, _, _ in start.own] == ["r1.critique"]
        _, raw_input, raw_result = start.own[0]
        assert json.loads(raw_input)["prompt"] == "p-r1.critique"
        assert json.loads(raw_result)["text"] == "t-r1.critique"
        assert client.keys(f"{keys.PREFIX}:conv:*fold10*") == []
        # Pause keys the step may skip come before the earlier steps: the same turns.
        again = store.begin_step(
            "fold10",
            "r2.critique",
            "me",
            60,
            "{}",
            earlier=("r1.critique",),
            known_pauses=("x", pause),
        )
        assert again.own == start.own and again.paused_s is None
    finally:
        client.delete(*keys.run_keys("fold10"))
        for key in ("r0.generate", "r1.critique", "r1.refine", "r2.critique"):
            client.delete(keys.step_claim("fold10", key))


def test_a_stored_result_leaves_out_zero_cache_counts(client: Any) -> None:
    """Prompt-cache counts of 0 are not stored (readers default them to 0); others are."""
    store = RunStore(client, finished_ttl_s=60)
    _running(store, "fold11", {"phase": "generate", "round": 0, "prompt": "p"})
    result = {
        "key": "r0.generate",
        "text": "t",
        "interrupted": None,
        "calls": 1,
        "input_tokens": 5,
        "cached_input_tokens": 0,
        "cache_write_tokens": 3,
    }
    try:
        done = event_json("actor_critic.actor_completed", "fold11", 0, phase="draft")
        assert store.complete_step("fold11", "r0.generate", result, done, "me")
        stored = json.loads(client.hget(keys.run_steps("fold11"), "r0.generate"))
        assert "cached_input_tokens" not in stored and stored["cache_write_tokens"] == 3
        assert stored["input_tokens"] == 5
        step = store.result("fold11").usage.total
        assert (step.cached_input_tokens, step.cache_write_tokens) == (0, 3)
    finally:
        client.delete(*keys.run_keys("fold11"), keys.step_claim("fold11", "r0.generate"))


def test_a_stored_step_leaves_out_what_every_reader_puts_back(client: Any) -> None:
    """The steps hash keeps a finished run's answers for days: its JSON is compact and
    leaves out the step's key (the field's name) and fields at their usual value."""
    store = RunStore(client, finished_ttl_s=60)
    _running(store, "fold-stored", {"phase": "generate", "round": 0, "prompt": "p"})
    result = {
        "key": "r0.generate",
        "text": "draft",
        "input_tokens": 3,
        "output_tokens": 2,
        "cached_input_tokens": 0,
        "cache_write_tokens": 0,
        "structured": False,
        "interrupted": None,
        "calls": 1,
    }
    unusual = {
        **result,
        "key": "r1.refine",
        "cached_input_tokens": 5,
        "structured": True,
        "interrupted": "max_tokens",
    }
    try:
        store.complete_step("fold-stored", "r0.generate", result, "{}", "me")
        raw = client.hget(keys.run_steps("fold-stored"), "r0.generate")
        assert json.loads(raw) == {
            "text": "draft",
            "input_tokens": 3,
            "output_tokens": 2,
            "calls": 1,
        }
        assert " " not in raw
        assert store.step_result("fold-stored", "r0.generate") == result
        client.hset(keys.run_steps("fold-stored"), "r1.refine", stored_result(unusual))
        assert json.loads(client.hget(keys.run_steps("fold-stored"), "r1.refine"))["structured"]
        _, steps = store.load_run("fold-stored")
        assert steps == {"r0.generate": result, "r1.refine": unusual}
    finally:
        client.delete(*keys.run_keys("fold-stored"))


def test_a_store_and_a_transition_push_their_message_in_their_own_script(client: Any) -> None:
    """The message that hands a run on goes with the change that calls for it, in the same
    script: a step's store pushes the coordinator's (also when the step was stored
    already: the transition is made once whatever the messages); a transition pushes its
    step's only when it is the one that makes the transition."""
    store = RunStore(client, finished_ttl_s=60)
    queue = f"{keys.PREFIX}:test:fold-send:queue"
    _running(store, "fold-send", {"phase": "generate", "round": 0, "prompt": "p"})
    result = {"key": "r0.generate", "text": "draft", "interrupted": None, "calls": 1}
    try:
        done = event_json("actor_critic.actor_completed", "fold-send", 0, phase="draft")
        assert store.complete_step(
            "fold-send",
            "r0.generate",
            result,
            done,
            "me",
            send=Outgoing(queue, "to the coordinator"),
        )
        assert client.lrange(queue, 0, -1) == ["to the coordinator"]
        again = Outgoing(queue, "again")
        assert not store.complete_step("fold-send", "r0.generate", result, done, "me", send=again)
        assert client.lrange(queue, 0, -1) == ["again", "to the coordinator"]
        client.delete(queue)

        run = client.hgetall(keys.run("fold-send"))
        step = Outgoing(queue, "the critique")
        assert store.record_step(run, 1, "r1.critique", {"prompt": "c"}, [], {}, step) == 1
        assert client.lrange(queue, 0, -1) == ["the critique"]
        # The same transition again (a redelivered coordinator message): not made, no push.
        assert store.record_step(run, 1, "r1.critique", {"prompt": "c"}, [], {}, step) == 0
        assert client.lrange(queue, 0, -1) == ["the critique"]
        # Without a message the transition pushes nothing (the worker sends it after).
        run = client.hgetall(keys.run("fold-send"))
        assert store.record_step(run, 2, "r1.refine", {"prompt": "r"}, [], {}) == 1
        assert client.llen(queue) == 1
    finally:
        client.delete(*keys.run_keys("fold-send"), queue)
