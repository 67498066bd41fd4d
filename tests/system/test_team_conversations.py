"""Persistent subagents on a real worker: whose conversation each call continues.

Conversations are keyed by the team, the role and the user; a batch's inputs each keep
their own unless the team asks for per-user memory; history is bounded by tokens as well
as turns; a reply cut at ``max_tokens`` is not stored. Every check reads what the stand-in
server was actually sent (the real OpenAI SDK, over HTTP).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import duet.standin.server as fake_llm
from duet.standin.server import FakeLLM
from orchestration import ActorCritic, Agent, RunResult, Team

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLM]:
    """A stand-in keeping every request body of a test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake_llm, "_LAST_REQUESTS", 2000)
        with FakeLLM() as llm:
            yield llm


@pytest.fixture
def llm(server: FakeLLM, worker: Any, client_on: str) -> FakeLLM:
    server.reset()
    return server


def tag() -> str:
    return uuid.uuid4().hex[:10]


def agents(llm: FakeLLM, *, critic: str = "sim:critic?scores=0.95", **actor: Any) -> dict:
    return {
        "actor": Agent("Fix the code.", model="openai:sim", base_url=llm.url, **actor),
        "critic": Agent("Review the code.", model=f"openai:{critic}", base_url=llm.url),
    }


def texts(request: dict[str, Any]) -> list[str]:
    """The user / assistant contents of one logged request, in order (no system prompt)."""
    return [m["content"] for m in request["body"]["messages"] if m["role"] != "system"]


def requests_ending_with(llm: FakeLLM, marker: str) -> list[list[str]]:
    """Every logged request whose new prompt (its last message) mentions ``marker``."""
    return [texts(r) for r in llm.last_requests if marker in texts(r)[-1]]


def run(team: Team, prompt: str, **kw: Any) -> RunResult:
    result = team.run_sync(prompt, timeout=60, **kw)
    assert result.finished and result.status != "failed", (result.status, result.error)
    return result


# --- keyed by the team --------------------------------------------------------------
def test_two_teams_of_one_user_keep_separate_conversations(llm: FakeLLM) -> None:
    user = f"alice-{tag()}"
    review = Team.actor_critic(**agents(llm), max_rounds=1, name=f"code-review-{tag()}")
    translate = Team.actor_critic(**agents(llm), max_rounds=1, name=f"translation-{tag()}")
    a1, a2, b1 = f"REVIEW1-{tag()}", f"REVIEW2-{tag()}", f"TRANSLATE-{tag()}"
    run(review, f"Task {a1}: review the parser.", user_id=user)
    run(translate, f"Task {b1}: translate the docs.", user_id=user)
    run(review, f"Task {a2}: review the lexer.", user_id=user)

    # team B's first request holds nothing of team A's conversation: just its prompt
    [b_first, *_] = requests_ending_with(llm, b1)
    assert b_first == [f"Task {b1}: translate the docs."]
    for request in requests_ending_with(llm, b1):
        assert not any(a1 in m or a2 in m for m in request), request
    # ...while team A's own next run continues A's conversation, not B's
    [a2_first, *_] = requests_ending_with(llm, a2)
    assert any(a1 in m for m in a2_first[:-1])
    assert not any(b1 in m for m in a2_first)


def test_unnamed_teams_differ_by_their_pair_and_the_same_pair_shares(llm: FakeLLM) -> None:
    user = f"bob-{tag()}"
    first, again, other = f"FIRST-{tag()}", f"AGAIN-{tag()}", f"OTHER-{tag()}"
    run(Team.actor_critic(**agents(llm), max_rounds=1), f"Task {first}: a cache.", user_id=user)
    # an equal team built again is the same team: it continues the conversation
    run(Team.actor_critic(**agents(llm), max_rounds=1), f"Task {again}: a queue.", user_id=user)
    # another critic is another team
    pair = agents(llm, critic="sim:critic?scores=0.96")
    run(Team.actor_critic(**pair, max_rounds=1), f"Task {other}: a stack.", user_id=user)
    [again_first, *_] = requests_ending_with(llm, again)
    assert any(first in m for m in again_first[:-1])
    for request in requests_ending_with(llm, other):
        assert not any(first in m or again in m for m in request)


# --- a batch: each input its own conversation unless asked -----------------------------
def _batch(team: Team, batch_tag: str, n: int, user: str) -> list[RunResult]:
    items = [
        {
            "id": f"f{i}",
            "prompt": f"Task item-{batch_tag}-{i:02d}: review file {i}.",
            "user_id": user,
        }
        for i in range(n)
    ]
    results = list(team.submit_batch(items).results(timeout=120))
    assert len(results) == n and all(r.finished and r.status != "failed" for r in results)
    return results


def test_batch_inputs_of_one_user_share_nothing_by_default(llm: FakeLLM) -> None:
    batch_tag, user = tag(), f"team-web-{tag()}"
    marker = re.compile(rf"item-{batch_tag}-\d\d")
    team = Team.actor_critic(**agents(llm, critic="sim:critic?scores=0.3,0.95"), max_rounds=2)
    results = _batch(team, batch_tag, 12, user)
    requests = [texts(r) for r in llm.last_requests]
    assert len(requests) == sum(r.usage.total.calls for r in results)
    with_history = 0
    for request in requests:
        found = {m for text in request for m in marker.findall(text)}
        assert len(found) == 1, f"a request mentions {sorted(found)}"
        with_history += len(request) > 1
    assert with_history >= 12  # each input's later calls did carry its own turns


def test_batch_with_per_user_memory_shares_a_users_conversation(llm: FakeLLM) -> None:
    batch_tag, user = tag(), f"team-payments-{tag()}"
    marker = re.compile(rf"item-{batch_tag}-\d\d")
    team = Team.actor_critic(**agents(llm), max_rounds=1, memory="per_user")
    _batch(team, batch_tag, 2, user)
    # Runs in flight together may interleave their turns (docs/providers.md): the second
    # batch starts after the first is done, so each of its calls reads the first's turns.
    later_tag = tag()
    llm.reset()
    _batch(team, later_tag, 4, user)
    for request in llm.last_requests:
        assert marker.search(" ".join(texts(request)[:-1])), texts(request)
    assert len(llm.last_requests) == 8  # a draft and a critique for each later input


# --- bounded by tokens ---------------------------------------------------------------
def _pairs(history: list[str]) -> list[tuple[str, str]]:
    return list(zip(history[0::2], history[1::2], strict=True))


def test_history_is_bounded_by_tokens_keeping_the_runs_own_turns(llm: FakeLLM) -> None:
    user, bound = f"carol-{tag()}", 1000
    team = Team.actor_critic(
        **agents(llm, critic="sim:critic?scores=0.3,0.95"),
        max_rounds=2,
        conversation_max_tokens=bound,
    )
    markers = [f"LONG{n}-{tag()}" for n in range(4)]
    filler = "x = compute(x)  # " * 45  # ~800 characters: ~200 tokens a prompt
    for marker in markers:
        run(team, f"Task {marker}: review this file.\n{filler}", user_id=user)
    last = markers[-1]
    calls = requests_ending_with(llm, last)
    assert len(calls) == 4  # generate, critique, refine, critique
    for n, request in enumerate(calls):
        pairs = _pairs(request[:-1])
        others = [(u, a) for u, a in pairs if last not in u]
        # earlier runs' turns fit the bound (about four characters a token)...
        assert sum(len(u) + len(a) for u, a in others) <= bound * 4
        if n >= 2:  # ...and the run's own draft and critique are always there
            assert any(last in u for u, _ in pairs), n
    # the newest earlier turns are kept, the oldest dropped
    history = calls[0][:-1]
    assert any(markers[2] in m for m in history)
    assert not any(markers[0] in m for m in history)
    # 20 turns and no token bound would have sent every earlier run (6 turns a role)
    assert 0 < len(history) // 2 < 6


def test_a_reply_cut_at_max_tokens_is_not_stored(llm: FakeLLM) -> None:
    user = f"dave-{tag()}"
    cut = Team.actor_critic(
        actor=Agent("Fix.", model="openai:sim?truncate_at=1", base_url=llm.url),
        critic=Agent("Review.", model="openai:sim:critic?scores=0.1", base_url=llm.url),
        max_rounds=2,
        name=f"cut-{tag()}",
    )
    first, second = f"CUT1-{tag()}", f"CUT2-{tag()}"
    result = run(cut, f"Task {first}: a parser.", user_id=user)
    assert result.interruption_reason == "actor:round_1:max_tokens"
    run(cut, f"Task {second}: a lexer.", user_id=user)
    [next_first, *_] = requests_ending_with(llm, second)
    history = next_first[:-1]
    assert any("[revision 0]" in m and first in m for m in history)  # the whole draft is kept
    assert not any(m.startswith("[revision 1]") for m in history)  # the cut revision is not


# --- the nested form and ActorCritic.run: what Team.actor_critic runs ----------------
def test_the_nested_form_and_actor_critic_run_keep_conversations(llm: FakeLLM) -> None:
    pair = agents(llm, critic="sim:critic?scores=0.4,0.95")
    loop = ActorCritic(**pair, max_rounds=3)
    nested = Agent("Manage actor + critic.", model="claude-opus-4-7", architecture=loop)
    team = Team.actor_critic(**pair, max_rounds=3)
    user = f"erin-{tag()}"
    one, two, three = f"N1-{tag()}", f"N2-{tag()}", f"N3-{tag()}"
    from_nested = run(nested, f"Task {one}: sanitize input.", user_id=user)
    from_loop = loop.run_sync(f"Task {two}: sanitize input.", user_id=user, timeout=60)
    from_team = run(team, f"Task {one}: sanitize input.", user_id=f"frank-{tag()}")
    # the same loop: same rounds, calls and (deterministic) output for the same prompt
    assert [r.score for r in from_nested.rounds] == [r.score for r in from_team.rounds]
    assert from_nested.output == from_team.output and from_nested.user_id == user
    assert from_loop.status == "approved" and from_loop.user_id == user
    # persistent: ActorCritic.run is the same team as Team.actor_critic (same pair and
    # settings), so it continues nothing of the nested agent's, which is a team of its own
    [two_first, *_] = requests_ending_with(llm, two)
    assert not any(one in m for m in two_first)
    run(nested, f"Task {three}: escape HTML.", user_id=user)
    [three_first, *_] = requests_ending_with(llm, three)
    assert any(one in m for m in three_first[:-1])  # the nested agent's own earlier run
    assert not any(two in m for m in three_first)


# --- what a finished run keeps ---------------------------------------------------------
def test_a_finished_run_deletes_its_own_conversations_and_keeps_a_users(
    llm: FakeLLM, client_on: str
) -> None:
    """A run's own conversations (scope ``run:<id>``: a batch input, a run without a user)
    and its steps' inputs are read by nobody once it is over, so its finish deletes them;
    a user's conversations stay, and so do the run's record, steps and events."""
    import redis as redis_lib

    from orchestration.client.handles import RunHandle

    user, alone_tag = f"gina-{tag()}", f"ALONE-{tag()}"
    team = Team.actor_critic(**agents(llm, critic="sim:critic?scores=0.3,0.95"), max_rounds=2)
    batch = _batch(team, tag(), 3, user)  # batch inputs: each its own conversation
    alone = run(team, f"Task {alone_tag}: a parser.")  # no user: its own conversation
    theirs = run(team, f"Task USER-{tag()}: a lexer.", user_id=user)  # the user's
    # the run's own conversation was there while it ran: its refine carried its history
    assert any(len(request) > 1 for request in requests_ending_with(llm, alone_tag))
    r = redis_lib.Redis.from_url(client_on, decode_responses=True)
    try:
        conversations = list(r.scan_iter(match="duet:conv:*", count=10000))
        own = [k for k in conversations if any(x.run_id in k for x in [*batch, alone])]
        assert own == []
        kept = [k for k in conversations if k.endswith(f":user:{user}")]
        assert len(kept) == 2 and all(r.llen(k) > 0 for k in kept)  # actor's and critic's
        for x in [*batch, alone, theirs]:
            # the run itself (record, steps, events) is kept, with its TTL; inputs are not
            assert all(r.ttl(f"duet:run:{{{x.run_id}}}{k}") > 0 for k in ("", ":steps", ":events"))
            assert not r.exists(f"duet:run:{{{x.run_id}}}:inputs")
            again = RunHandle(x.run_id).result(timeout=5)  # and still reads back whole
            assert again.output == x.output and again.rounds == x.rounds
    finally:
        r.close()
