"""Persistent conversations: bounds, order, isolation by scope and role.

Turns are appended the one way the system appends them: by the script that stores a
step's result (``RunStore.complete_step``), so what is tested is what runs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestration.state import keys
from orchestration.state.conversations import history, keeps, messages_from, own_turns, turn_json
from orchestration.state.runs import RunStore


def K(role: str, scope: str) -> str:  # noqa: N802 - short, read in every assertion
    return keys.conversation("team", role, scope)


class Conv:
    """A run store and the reads of its conversations, for these tests."""

    def __init__(self, client: Any) -> None:
        self.store = RunStore(client, finished_ttl_s=600)
        self.r = client

    def append(self, key: str, turns: int, *, step_id: str, prompt: str, reply: str) -> bool:
        """Store a step result of run ``step_id`` with its turn, as a step does (a reply
        the step would not keep is not offered)."""
        run_id, _, step = step_id.partition("/")
        step = step or "r0.generate"
        conversation = (key, turn_json(step_id, prompt, reply), turns)
        return self.store.complete_step(
            run_id,
            step,
            {"key": step, "text": reply},
            "{}",
            "claimant",
            conversation=conversation if keeps(turns, reply) else None,
        )

    def history(self, key: str, turns: int) -> list[Any]:
        return history(self.r, key, turns)


@pytest.fixture(params=["fakeredis", "redis"])
def conv(request: pytest.FixtureRequest) -> Conv:
    """On fakeredis and on a real server (the same assertions hold on both)."""
    client = request.getfixturevalue(
        "fake_redis" if request.param == "fakeredis" else "redis_client"
    )
    return Conv(client)


def add(conv: Conv, scope: str, n: int, *, role: str = "actor", turns: int = 20) -> None:
    conv.append(
        K(role, scope),
        turns,
        step_id=f"run-{scope}-{role}-{n}/r0.generate",
        prompt=f"ask {n}",
        reply=f"answer {n}",
    )


def test_turns_come_back_in_order_as_alternating_messages(conv: Conv) -> None:
    assert conv.history(K("actor", "user:a"), 20) == []
    add(conv, "user:a", 1)
    add(conv, "user:a", 2)
    assert conv.history(K("actor", "user:a"), 20) == [
        {"role": "user", "content": "ask 1"},
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "ask 2"},
        {"role": "assistant", "content": "answer 2"},
    ]


def test_bounded_oldest_dropped_first(conv: Conv) -> None:
    for n in range(25):
        add(conv, "user:a", n, turns=20)
    assert conv.r.llen(K("actor", "user:a")) == 20
    history = conv.history(K("actor", "user:a"), 20)
    assert [m["content"] for m in history[::2]] == [f"ask {n}" for n in range(5, 25)]
    # a spec keeping fewer turns reads only the newest of a shared conversation
    assert [m["content"] for m in conv.history(K("actor", "user:a"), 3)[::2]] == [
        "ask 22",
        "ask 23",
        "ask 24",
    ]


def test_scopes_and_roles_are_isolated(conv: Conv) -> None:
    add(conv, "user:a", 1)
    add(conv, "user:b", 2)
    add(conv, "run:r1", 3)
    add(conv, "run:r2", 4)
    add(conv, "user:a", 5, role="critic")
    contents = {
        (role, scope): [m["content"] for m in conv.history(K(role, scope), 20)]
        for role in ("actor", "critic")
        for scope in ("user:a", "user:b", "run:r1", "run:r2")
    }
    assert contents == {
        ("actor", "user:a"): ["ask 1", "answer 1"],
        ("actor", "user:b"): ["ask 2", "answer 2"],
        ("actor", "run:r1"): ["ask 3", "answer 3"],
        ("actor", "run:r2"): ["ask 4", "answer 4"],
        ("critic", "user:a"): ["ask 5", "answer 5"],
        ("critic", "user:b"): [],
        ("critic", "run:r1"): [],
        ("critic", "run:r2"): [],
    }


def test_no_turns_kept_means_nothing_stored(conv: Conv) -> None:
    add(conv, "user:a", 1, turns=0)
    assert conv.history(K("actor", "user:a"), 0) == []
    assert conv.r.exists(K("actor", "user:a")) == 0


def test_empty_reply_is_not_stored(conv: Conv) -> None:
    # An empty assistant turn would make the vendors refuse every later call.
    conv.append(K("actor", "user:a"), 20, step_id="r/x", prompt="ask", reply="  ")
    assert conv.history(K("actor", "user:a"), 20) == []


def test_expires_when_left_alone(conv: Conv) -> None:
    add(conv, "user:a", 1)
    assert 0 < conv.r.ttl(K("actor", "user:a")) <= 600


def test_a_step_stored_twice_appends_its_turn_once(conv: Conv) -> None:
    # A redelivered step whose call was repeated: only the stored result adds a turn.
    assert (
        conv.append(K("actor", "user:a"), 20, step_id="run1/r0.generate", prompt="ask", reply="x")
        is True
    )
    assert (
        conv.append(K("actor", "user:a"), 20, step_id="run1/r0.generate", prompt="ask", reply="x")
        is False
    )
    conv.append(K("actor", "user:a"), 20, step_id="run1/r1.refine", prompt="again", reply="y")
    assert [m["content"] for m in conv.history(K("actor", "user:a"), 20)] == [
        "ask",
        "x",
        "again",
        "y",
    ]


def test_a_turn_listed_twice_is_read_once() -> None:
    raw = [turn_json("run1/r0.generate", "ask", "x")] * 2 + [turn_json("run1/r1", "again", "y")]
    assert [m["content"] for m in messages_from(raw)] == ["ask", "x", "again", "y"]


def test_messages_from_decoded_and_raw() -> None:
    raw = ['{"s":"a","u":"q","a":"r"}', b'{"u":"q2","a":"r2"}']
    assert [m["content"] for m in messages_from(raw)] == ["q", "r", "q2", "r2"]


def test_messages_from_bounds_by_tokens_keeping_the_runs_own() -> None:
    from orchestration.state.conversations import turn_json

    def turn(step: str) -> str:
        return turn_json(step, "u" * 200, "a" * 200)  # about 100 tokens

    raw = [turn("old/r0.generate"), turn("mid/r0.generate"), turn("me/r0.generate")]
    kept = messages_from(raw, max_tokens=150, run_id="me")
    assert len(kept) == 2  # only this run's own turn: others do not fit beside it
    assert len(messages_from(raw, max_tokens=200, run_id="me")) == 4  # the newest other too
    assert len(messages_from(raw)) == 6


def test_storing_past_the_token_bound_drops_the_oldest_to_half_of_it(redis_client: Any) -> None:
    """The store's own script: past the bound the oldest turns of other runs go, down to
    half of it, so the next calls share one prefix; the storing run's turns stay."""
    from orchestration.state.conversations import turn_json
    from orchestration.state.runs import RunStore

    store = RunStore(redis_client, finished_ttl_s=600)
    key = K("actor", "user:a")

    def store_turn(run: str, n: int, chars: int = 400) -> None:
        turn = turn_json(f"{run}/r{n}.refine", "u" * (chars // 2), "a" * (chars // 2))
        store.complete_step(
            run,
            f"r{n}.refine",
            {"key": f"r{n}.refine", "text": "x"},
            "{}",
            "claimant",
            conversation=(key, turn, 20),
            conversation_max_tokens=1000,
        )

    def runs_kept() -> list[str]:
        return [json.loads(t)["s"] for t in redis_client.lrange(key, 0, -1)]

    for n in range(9):  # 9 turns of ~430 characters: under 4,000 characters
        store_turn(f"old{n}", 1)
    assert len(runs_kept()) == 9
    store_turn("old9", 1)  # past 4,000: down to <= 2,000 characters, newest kept
    kept = runs_kept()
    assert kept == [f"old{n}/r1.refine" for n in range(10 - len(kept), 10)]
    assert sum(len(t) for t in redis_client.lrange(key, 0, -1)) <= 2000 < 4000
    assert len(kept) >= 4
    # the next few stores keep that prefix: no turn dropped until the bound is passed again
    before = runs_kept()
    store_turn("new", 1)
    assert runs_kept() == [*before, "new/r1.refine"]
    # a run's own turns are never dropped, even when they alone pass the bound
    for n in range(2, 5):
        store_turn("big", n, chars=3000)
    assert [s for s in runs_kept() if s.startswith("big/")] == [
        f"big/r{n}.refine" for n in (2, 3, 4)
    ]
    assert not any(s.startswith("old") for s in runs_kept())


def test_a_runs_own_turns_are_its_whole_stored_answers() -> None:
    """own_turns: stored steps whose answer is whole and not empty, the last ``turns``."""

    def step(key: str, text: str | None, stop: str = "end") -> tuple[str, str, str]:
        result = json.dumps({"key": key, "text": text, "stop_reason": stop})
        return key, json.dumps({"prompt": f"p-{key}"}), result

    earlier = [
        step("r0.generate", "draft"),
        step("r1.refine", "cut", stop="max_tokens"),
        step("r2.refine", "  "),
        step("r3.refine", None),
        ("r4.refine", json.dumps({"prompt": "p"}), ""),
        step("r5.refine", "last"),
    ]
    turns = own_turns("run1", earlier, 5)
    assert [(t.step, t.prompt, t.reply) for t in turns] == [
        ("run1/r0.generate", "p-r0.generate", "draft"),
        ("run1/r5.refine", "p-r5.refine", "last"),
    ]
    assert [t.reply for t in own_turns("run1", earlier, 1)] == ["last"]
    assert own_turns("run1", earlier, 0) == []
