"""The loop on real vendors' SDKs: a real worker process, real Redis, the HTTP stand-in.

One stand-in server per vendor, so each server's own statistics are exactly what one
role was sent (the actor and the critic are always on different vendors here). The
worker reaches them through ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``, as it would
reach the real APIs.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import duet.standin.server as fake_llm
from duet.standin.server import FakeLLM
from orchestration import Agent, RunResult, Team
from orchestration.core import events as ev
from orchestration.core.pricing import cost_usd
from orchestration.prices import listed_price
from orchestration.state.runs import RunStore
from tests.support import celery_worker, client_pointed_at

pytestmark = pytest.mark.system

OPENAI_KEY = "sk-test-Zq81xK2mPw9sECRET"
ANTHROPIC_KEY = "plain-anthropic-secret-5521"
ACTOR = "You are a careful engineer. Answer the task."
CRITIC = 'You are a strict critic. Reply with JSON: {"score": 0..1, "issues": [...]}.'
CLAUDE, GPT = "claude-haiku-4-5", "gpt-4o"
MAX_ATTEMPTS = 3
#: The vendor's request log must hold every request of the 50-run batch.
REQUEST_LOG = 1000


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FakeLLM]]:
    """One stand-in per vendor, keeping every request body of a test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fake_llm, "_LAST_REQUESTS", REQUEST_LOG)
        with FakeLLM() as anthropic, FakeLLM() as openai:
            yield {"anthropic": anthropic, "openai": openai}


@pytest.fixture(scope="module")
def vendor_url(redis_url: str) -> Iterator[str]:
    """This module's Redis (the test db, not the shared system db, whose worker has no
    vendor endpoints), with this process's client API pointed at it."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    with client_pointed_at(redis_url):
        yield redis_url


@pytest.fixture(scope="module")
def vendor_worker(vendor_url: str, servers: dict[str, FakeLLM]) -> Iterator[Any]:
    """A ``celery -A workers worker`` process whose vendor SDKs talk to the stand-ins."""
    env = {
        "OPENAI_BASE_URL": servers["openai"].url,
        "ANTHROPIC_BASE_URL": servers["anthropic"].anthropic_url,
        "OPENAI_API_KEY": OPENAI_KEY,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "DUET_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "DUET_RETRY_BASE_S": "0.05",
        "DUET_RETRY_MAX_S": "0.2",
    }
    with celery_worker(vendor_url, env=env, concurrency=64, name="vendors") as proc:
        yield proc


@pytest.fixture
def llm(servers: dict[str, FakeLLM], vendor_worker: Any) -> dict[str, FakeLLM]:
    """Both stand-ins with fresh statistics and no faults, the worker running."""
    for server in servers.values():
        server.reset()
    return servers


def vendor(model: str) -> str:
    return "anthropic" if model.startswith("claude") else "openai"


def team(actor: str = CLAUDE, critic: str = GPT, *, actor_kw: Any = None, **kw: Any) -> Team:
    kw.setdefault("max_rounds", 2)
    kw.setdefault("approval_threshold", 1.0)
    return Team.actor_critic(
        actor=Agent(ACTOR, model=actor, **(actor_kw or {})),
        critic=Agent(CRITIC, model=critic),
        **kw,
    )


def tag() -> str:
    return uuid.uuid4().hex[:10]


def run(t: Team, prompt: str, **kw: Any) -> RunResult:
    return t.run_sync(prompt, timeout=60, **kw)


def events(result: RunResult, type_: str) -> list[Any]:
    return [e for e in result.events if e.type == type_]


def texts(request: dict[str, Any]) -> list[str]:
    """The user / assistant message contents of one logged request, in order."""
    return [
        m["content"]
        if isinstance(m["content"], str)
        else "".join(part.get("text", "") for part in m["content"])  # cache_control blocks
        for m in request["body"]["messages"]
        if m["role"] != "system"
    ]


# --- usage and cost -------------------------------------------------------------------
@pytest.mark.parametrize(("actor", "critic"), [(CLAUDE, GPT), (GPT, CLAUDE)])
def test_usage_and_usd_equal_what_the_vendors_sent(
    llm: dict[str, FakeLLM], actor: str, critic: str
) -> None:
    result = run(team(actor, critic), f"Write a function that parses ISO dates ({tag()}).")
    assert result.status in ("approved", "max_rounds_reached"), result.error
    total_usd = 0.0
    for role, model in (("actor", actor), ("critic", critic)):
        used = result.usage.by_role[role]
        sent = llm[vendor(model)].stats()
        assert sent["usage"] == {
            "input_tokens": used.input_tokens,
            "output_tokens": used.output_tokens,
            "cached_input_tokens": used.cached_input_tokens,
            "cache_write_tokens": used.cache_write_tokens,
            "responses": used.calls,
        }
        assert sent["requests"] == used.calls and set(sent["by_model"]) == {model}
        assert used.usd == pytest.approx(
            cost_usd(
                listed_price(vendor(model), model),
                used.input_tokens,
                used.output_tokens,
                used.cached_input_tokens,
                used.cache_write_tokens,
            ),
            rel=1e-9,
        )
        assert used.usd > 0
        total_usd += used.usd
    assert result.usage.total.calls == 1 + 2 * len(result.rounds) - (result.status == "approved")
    assert result.usage.total.input_tokens == sum(
        s.stats()["usage"]["input_tokens"] for s in llm.values()
    )
    assert result.usage.total.usd == pytest.approx(total_usd, rel=1e-9)


# --- transient failures: retried by re-scheduling the step ----------------------------
def test_rate_limit_retry_after_is_honoured(llm: dict[str, FakeLLM]) -> None:
    server = llm["anthropic"]
    server.set_faults(status=429, times=1, retry_after="1")
    result = run(team(max_rounds=1, approval_threshold=0.0), f"Sort a list ({tag()}).")
    assert result.status == "approved", (result.interruption_reason, result.error)
    first, second = (a["t"] for a in server.stats()["arrivals"][:2])
    assert second - first >= 1.0  # the retried request waited out Retry-After
    [retry] = events(result, ev.STEP_RETRY)
    assert retry.data["kind"] == "rate_limited" and retry.data["attempt"] == 1
    assert retry.data["wait"] >= 1.0 and retry.round == 0
    # nothing repeated: one started event for the step, and usage is the served call's
    assert len([e for e in events(result, ev.ACTOR_STARTED) if e.round == 0]) == 1
    assert server.stats()["usage"]["responses"] == result.usage.by_role["actor"].calls == 1


def test_server_error_then_success_costs_one_extra_request(llm: dict[str, FakeLLM]) -> None:
    server = llm["openai"]  # the critic's
    server.set_faults(status=500, times=1)
    result = run(team(max_rounds=1, approval_threshold=0.0), f"Parse a CSV line ({tag()}).")
    assert result.status == "approved", (result.interruption_reason, result.error)
    stats = server.stats()
    assert stats["requests"] == result.usage.by_role["critic"].calls + 1 == 2
    assert stats["by_status"] == {"500": 1, "200": 1}
    [retry] = events(result, ev.STEP_RETRY)
    assert (retry.data["kind"], retry.data["status_code"], retry.round) == ("server_error", 500, 1)


def test_retries_run_out_and_interrupt_keeping_the_draft(llm: dict[str, FakeLLM]) -> None:
    llm["openai"].set_faults(status=503)
    result = run(team(), f"Merge two dicts ({tag()}).")
    assert result.status == "interrupted"
    assert result.interruption_reason == "critic:round_1:provider_error:server_error"
    assert llm["openai"].stats()["requests"] == MAX_ATTEMPTS
    assert [e.data["attempt"] for e in events(result, ev.STEP_RETRY)] == [1, 2]
    assert result.output and result.output.startswith("[revision 0]")
    assert "HTTP 503" in (result.error or "")


# --- permanent failures: the agent is interrupted, the run keeps what it had ----------
@pytest.mark.parametrize(
    ("faulted", "reason"), [("actor", "actor:round_0"), ("critic", "critic:round_1")]
)
def test_auth_error_interrupts_without_leaking_the_key(
    llm: dict[str, FakeLLM], faulted: str, reason: str
) -> None:
    # the actor is on Anthropic, the critic on OpenAI; the stand-in echoes the key on 401
    llm["anthropic" if faulted == "actor" else "openai"].set_faults(status=401)
    result = run(team(), f"Escape HTML ({tag()}).")
    assert result.status == "interrupted"
    assert result.interruption_reason == f"{reason}:provider_error:auth"
    assert result.error and "HTTP 401" in result.error
    everything = result.model_dump_json()
    for secret in (OPENAI_KEY, ANTHROPIC_KEY, "Zq81xK2m", "anthropic-secret"):
        assert secret not in everything
    assert not events(result, ev.STEP_RETRY)  # permanent: tried once
    if faulted == "critic":
        assert result.output and result.output.startswith("[revision 0]")


def test_truncated_output_interrupts_with_max_tokens(llm: dict[str, FakeLLM]) -> None:
    result = run(team(actor_kw={"max_tokens": 5}), f"Explain recursion ({tag()}).")
    assert result.status == "interrupted"
    assert result.interruption_reason == "actor:round_0:max_tokens"
    assert result.output is not None and len(result.output) == 20  # the partial text is kept
    assert result.usage.total.output_tokens == 5


def test_missing_key_is_reported_on_the_run(llm: dict[str, FakeLLM]) -> None:
    t = team(actor_kw={"api_key_env": "DUET_TEST_UNSET_KEY"})
    result = run(t, f"Reverse a string ({tag()}).")
    assert result.status == "interrupted"
    assert result.interruption_reason == "actor:round_0:provider_error:missing_key"
    assert result.error and "DUET_TEST_UNSET_KEY" in result.error
    assert llm["anthropic"].stats()["requests"] == 0
    # the worker is fine: the next run goes through
    assert run(team(max_rounds=1, approval_threshold=0.0), f"Add ({tag()}).").status == "approved"


# --- persistent conversations -------------------------------------------------------
def request_with(server: FakeLLM, marker: str) -> dict[str, Any]:
    """The logged request whose new prompt (last message) mentions ``marker``."""
    found = [r for r in server.last_requests if marker in texts(r)[-1]]
    assert len(found) == 1, f"{len(found)} requests end with {marker!r}"
    return found[0]


def test_a_users_next_run_continues_the_conversation(llm: dict[str, FakeLLM]) -> None:
    t = team(max_rounds=1, approval_threshold=0.0)
    alice, bob = f"alice-{tag()}", f"bob-{tag()}"
    first, second, other = f"ALPHA-{tag()}", f"BETA-{tag()}", f"GAMMA-{tag()}"
    assert run(t, f"Task {first}: write a parser.", user_id=alice).status == "approved"
    assert run(t, f"Task {second}: write a lexer.", user_id=alice).status == "approved"
    assert run(t, f"Task {other}: write a cache.", user_id=bob).status == "approved"
    for role, server in (("actor", llm["anthropic"]), ("critic", llm["openai"])):
        seen = texts(request_with(server, second))
        assert len(seen) == 3 and first in seen[0], role  # alice's earlier turn, then the prompt
        assert seen[1]  # ...with the reply the model gave
        for marker in (first, second):  # bob never sees alice's text
            assert not any(marker in m for m in texts(request_with(server, other))), role
        assert len(texts(request_with(server, other))) == 1


@pytest.mark.parametrize(("actor", "critic"), [(CLAUDE, GPT), (GPT, CLAUDE)])
def test_twenty_turn_conversation_reads_the_prompt_cache(
    llm: dict[str, FakeLLM], actor: str, critic: str
) -> None:
    """A user's 20 runs: each role's conversation grows to 20 turns, its earlier turns
    are read from the vendor's prompt cache, and priced at the cached rate."""
    # No token bound short of 20 turns: the whole conversation is the cached prefix.
    t = team(actor, critic, max_rounds=1, approval_threshold=0.0, conversation_max_tokens=10**6)
    user = f"dana-{tag()}"
    results = [run(t, f"Task {n} ({tag()}): write a parser.", user_id=user) for n in range(20)]
    assert all(r.status == "approved" for r in results)
    for role, model in (("actor", actor), ("critic", critic)):
        used = [r.usage.by_role[role] for r in results]
        sent = llm[vendor(model)].stats()["usage"]
        # what the vendor reported is what the runs recorded, call by call summed
        assert sent["cached_input_tokens"] == sum(u.cached_input_tokens for u in used) > 0
        assert sent["cache_write_tokens"] == sum(u.cache_write_tokens for u in used)
        assert sent["input_tokens"] == sum(u.input_tokens for u in used)
        assert used[0].cached_input_tokens == 0  # nothing to read on the first turn
        assert used[-1].cached_input_tokens > used[-1].input_tokens / 2  # most of turn 20
        price = listed_price(vendor(model), model)
        assert price is not None and price.cached_input_per_mtok is not None
        for u in used:
            expected = cost_usd(
                price, u.input_tokens, u.output_tokens, u.cached_input_tokens, u.cache_write_tokens
            )
            assert u.usd == pytest.approx(expected, rel=1e-9)
        full = cost_usd(price, used[-1].input_tokens, used[-1].output_tokens)
        assert used[-1].usd < full  # the cached part was billed at the cached rate


@pytest.mark.parametrize(("actor", "critic"), [(CLAUDE, GPT), (GPT, CLAUDE)])
def test_critiques_are_structured_natively(
    llm: dict[str, FakeLLM], actor: str, critic: str, vendor_url: str
) -> None:
    """The critic's instructions say nothing of JSON: the vendor's structured output
    alone gives the loop its scores, with no fallback to reading prose."""
    judge = "Review the answer and list its problems."
    t = Team.actor_critic(
        actor=Agent(ACTOR, model=actor),
        critic=Agent(judge, model=critic),
        max_rounds=2,
        approval_threshold=1.0,
    )
    result = run(t, f"Write a function that parses ISO dates ({tag()}).")
    assert result.status == "max_rounds_reached" and len(result.rounds) == 2
    store = RunStore(redis.Redis.from_url(vendor_url, decode_responses=True))
    requests = [r for r in llm[vendor(critic)].last_requests if r["model"] == critic]
    assert len(requests) == 2
    for n, (record, request) in enumerate(zip(result.rounds, requests, strict=True), start=1):
        step = store.step_result(result.run_id, f"r{n}.critique")
        assert step is not None and step["structured"] is True  # no fallback parse
        assert 0 < record.score < 1 and record.score == step["score"]
        body = request["body"]
        assert "response_format" in body if vendor(critic) == "openai" else "tool_choice" in body
    # Asked without the shape, the critique is found in the reply's text (the fallback).
    t_off = Team.actor_critic(
        actor=Agent(ACTOR, model=actor),
        critic=Agent(judge, model=critic, structured_output=False),
        max_rounds=1,
        approval_threshold=1.0,
    )
    off = run(t_off, f"Write a function that parses ISO dates ({tag()}).")
    step = RunStore(redis.Redis.from_url(vendor_url, decode_responses=True)).step_result(
        off.run_id, "r1.critique"
    )
    assert step is not None and step["structured"] is False
    body = [r for r in llm[vendor(critic)].last_requests if r["model"] == critic][-1]["body"]
    assert not {"response_format", "tools", "tool_choice"} & set(body)


def test_without_persistence_each_call_is_just_its_prompt(llm: dict[str, FakeLLM]) -> None:
    t = team(persistent_subagents=False)
    user = f"carol-{tag()}"
    for n in range(2):
        assert run(t, f"Task {n}: write a queue ({tag()}).", user_id=user).finished
    requests = llm["anthropic"].last_requests + llm["openai"].last_requests
    assert len(requests) >= 6
    assert all(len(texts(r)) == 1 for r in requests)


def test_batch_of_fifty_anonymous_runs_has_no_cross_talk(llm: dict[str, FakeLLM]) -> None:
    batch_tag = tag()
    marker = re.compile(rf"item-{batch_tag}-\d\d")
    prompts = [f"Task item-{batch_tag}-{n:02d}: validate input number {n}." for n in range(50)]
    batch = team().submit_batch(prompts)
    results = list(batch.results(timeout=120))
    assert len(results) == 50 and all(r.finished for r in results)
    requests = llm["anthropic"].last_requests + llm["openai"].last_requests
    assert len(requests) == sum(r.usage.total.calls for r in results) < REQUEST_LOG
    with_history = 0
    for request in requests:
        found = {m for text in texts(request) for m in marker.findall(text)}
        assert len(found) == 1, f"one request mentions {sorted(found)}"
        with_history += len(texts(request)) > 1
    assert with_history >= 50  # refine and later critiques did carry their own run's turns


def test_different_users_are_served_concurrently(llm: dict[str, FakeLLM]) -> None:
    latency_s = 0.5
    for server in llm.values():
        server.set_faults(latency_ms=latency_s * 1000)
    t = team(max_rounds=1, approval_threshold=0.0)
    users = [f"u{n}-{tag()}" for n in range(8)]
    handles = {u: t.submit(f"Task for {u}: write a stack.", user_id=u) for u in users}
    for handle in handles.values():
        assert handle.result(timeout=60).status == "approved"
    stats = llm["anthropic"].stats()
    arrived = {
        next(u for u in users if u in texts(req)[-1]): arrival["t"]
        for arrival, req in zip(stats["arrivals"], stats["last_requests"], strict=True)
    }
    assert set(arrived) == set(users)
    # every user's actor call arrived while every other one was still being answered
    assert max(arrived.values()) - min(arrived.values()) < latency_s


def test_close_and_reset_providers() -> None:
    import workers.providers as providers

    spec = Agent(ACTOR, model=GPT, base_url=None).spec
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(providers, "_adapters", {})
        mp.setenv("OPENAI_API_KEY", "sk-test-local")
        adapter = providers.provider_for(spec)
        client = adapter.client()  # type: ignore[attr-defined]
        providers.close_providers()
        assert providers.provider_for(spec) is adapter  # kept, its client closed
        assert adapter.client() is not client  # type: ignore[attr-defined]
        providers.reset_providers()
        assert providers.provider_for(spec) is not adapter
        providers.reset_providers()
    assert os.environ.get("OPENAI_API_KEY") != "sk-test-local"
