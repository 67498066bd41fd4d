"""The persistent conversation store: bounds, order, isolation by scope and role."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration.state import keys
from orchestration.state.conversations import ConversationStore, conversation_scope, messages_from


@pytest.fixture(params=["fakeredis", "redis"])
def conv(request: pytest.FixtureRequest) -> ConversationStore:
    """The store on fakeredis and on a real server (the same assertions hold on both)."""
    client = request.getfixturevalue(
        "fake_redis" if request.param == "fakeredis" else "redis_client"
    )
    return ConversationStore(client, ttl_s=600)


def add(
    conv: ConversationStore, scope: str, n: int, *, role: str = "actor", turns: int = 20
) -> None:
    conv.append(
        role, scope, turns, step_id=f"run/{scope}/{n}", prompt=f"ask {n}", reply=f"answer {n}"
    )


def test_scope_is_the_user_else_the_run() -> None:
    assert conversation_scope("alice", "r1") == "user:alice"
    assert conversation_scope(None, "r1") == "run:r1"
    assert conversation_scope("", "r1") == "run:r1"


def test_turns_come_back_in_order_as_alternating_messages(conv: ConversationStore) -> None:
    assert conv.history("actor", "user:a", 20) == []
    add(conv, "user:a", 1)
    add(conv, "user:a", 2)
    assert conv.history("actor", "user:a", 20) == [
        {"role": "user", "content": "ask 1"},
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "ask 2"},
        {"role": "assistant", "content": "answer 2"},
    ]


def test_bounded_oldest_dropped_first(conv: ConversationStore) -> None:
    for n in range(25):
        add(conv, "user:a", n, turns=20)
    assert conv.r.llen(keys.conversation("actor", "user:a")) == 20
    history = conv.history("actor", "user:a", 20)
    assert [m["content"] for m in history[::2]] == [f"ask {n}" for n in range(5, 25)]
    # a spec keeping fewer turns reads only the newest of a shared conversation
    assert [m["content"] for m in conv.history("actor", "user:a", 3)[::2]] == [
        "ask 22",
        "ask 23",
        "ask 24",
    ]


def test_scopes_and_roles_are_isolated(conv: ConversationStore) -> None:
    add(conv, "user:a", 1)
    add(conv, "user:b", 2)
    add(conv, "run:r1", 3)
    add(conv, "run:r2", 4)
    add(conv, "user:a", 5, role="critic")
    contents = {
        (role, scope): [m["content"] for m in conv.history(role, scope, 20)]
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


def test_no_turns_kept_means_nothing_stored(conv: ConversationStore) -> None:
    add(conv, "user:a", 1, turns=0)
    assert conv.history("actor", "user:a", 0) == []
    assert conv.r.exists(keys.conversation("actor", "user:a")) == 0


def test_empty_reply_is_not_stored(conv: ConversationStore) -> None:
    # An empty assistant turn would make the vendors refuse every later call.
    conv.append("actor", "user:a", 20, step_id="r/x", prompt="ask", reply="  ")
    assert conv.history("actor", "user:a", 20) == []


def test_expires_when_left_alone(conv: ConversationStore) -> None:
    add(conv, "user:a", 1)
    assert 0 < conv.r.ttl(keys.conversation("actor", "user:a")) <= 600


def test_a_step_stored_twice_is_read_once(conv: ConversationStore) -> None:
    for _ in range(2):
        conv.append("actor", "user:a", 20, step_id="run1/r0.generate", prompt="ask", reply="x")
    conv.append("actor", "user:a", 20, step_id="run1/r1.refine", prompt="again", reply="y")
    assert [m["content"] for m in conv.history("actor", "user:a", 20)] == ["ask", "x", "again", "y"]


def test_append_on_a_callers_pipeline(conv: ConversationStore) -> None:
    pipe: Any = conv.r.pipeline(transaction=False)
    conv.append("actor", "user:a", 20, step_id="s", prompt="ask", reply="x", pipe=pipe)
    assert conv.history("actor", "user:a", 20) == []  # only queued
    pipe.execute()
    assert len(conv.history("actor", "user:a", 20)) == 2
    conv.clear("actor", "user:a")
    assert conv.history("actor", "user:a", 20) == []


def test_messages_from_decoded_and_raw() -> None:
    raw = ['{"s":"a","u":"q","a":"r"}', b'{"u":"q2","a":"r2"}']
    assert [m["content"] for m in messages_from(raw)] == ["q", "r", "q2", "r2"]
