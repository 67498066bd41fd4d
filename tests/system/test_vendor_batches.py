"""Vendor batch APIs: the adapters' batch methods, with the real SDKs, against the stand-in.

OpenAI: a JSONL file uploaded to ``/v1/files`` and run by ``/v1/batches``; Anthropic:
``/v1/messages/batches``. The stand-in answers each request as a synchronous call would
(same text, same usage), after a configurable delay, with per-request failures and expiry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import workers.providers as providers
from duet.standin.server import FakeLLM
from orchestration.core.agents import Agent
from orchestration.core.errors import ConfigError, ProviderError
from orchestration.core.structured import read_structured
from orchestration.core.tools import ToolSpec
from tests.support import wait_for
from workers.providers import Completion, provider_for
from workers.providers.batch import BatchRequest

OPENAI_KEY = "sk-test-Zq81xK2mPw9sECRET"
ANTHROPIC_KEY = "plain-anthropic-secret-5521"
MODELS = {"openai": "gpt-4o", "anthropic": "claude-haiku-4-5"}
PROVIDERS = list(MODELS)
ACTOR = "You are a careful engineer. Answer the task."
JUDGE = "Review the answer and list its problems."
SYNC_PATHS = {"/v1/chat/completions", "/v1/messages"}


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.anthropic_url)
        monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
        monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        adapters: dict[Any, Any] = {}
        monkeypatch.setattr(providers, "_adapters", adapters)
        yield server
        for adapter in adapters.values():
            adapter.close()


def requests_for(provider: str, n: int, marker: str = "") -> list[BatchRequest]:
    """``n`` actor requests and one structured critique, custom ids ``a0``..., ``c0``."""
    actor = Agent(ACTOR, model=MODELS[provider]).spec
    judge = Agent(JUDGE, model=MODELS[provider]).spec
    found = [
        BatchRequest(
            f"a{i}", actor, [{"role": "user", "content": f"Task {i}{marker}: write a parser."}]
        )
        for i in range(n)
    ]
    critique = [{"role": "user", "content": "[revision 1] my answer"}]
    return [*found, BatchRequest("c0", judge, critique, structured=True)]


def run_batch(provider: str, requests: list[BatchRequest], timeout: float = 10) -> dict[str, Any]:
    adapter = provider_for(requests[0].agent)
    batch_id = adapter.submit_batch(requests)
    wait_for(lambda: adapter.poll_batch(batch_id).ended, timeout, f"{provider} batch to end")
    return adapter.batch_results(batch_id, {r.custom_id: r.structured for r in requests})


@pytest.mark.parametrize("provider", PROVIDERS)
def test_batch_answers_as_synchronous_calls_would(llm: FakeLLM, provider: str) -> None:
    requests = requests_for(provider, 4)
    outcomes = run_batch(provider, requests)
    assert list(outcomes) == [r.custom_id for r in requests]
    assert all(isinstance(o, Completion) for o in outcomes.values())
    stats = llm.stats()
    assert not SYNC_PATHS & set(stats["by_path"])  # no synchronous completion request
    assert stats["batches"]["batches"] == 1 and stats["batches"]["batch_requests"] == 5
    # the same request made synchronously gets the same answer and usage
    for r in requests:
        alone = provider_for(r.agent).complete(r.agent, r.messages, structured=r.structured)
        got = outcomes[r.custom_id]
        assert (got.text, got.input_tokens, got.output_tokens) == (
            alone.text,
            alone.input_tokens,
            alone.output_tokens,
        )
    critique = outcomes["c0"]
    assert critique.structured is not None and read_structured(critique.structured) is not None
    assert outcomes["a0"].structured is None and outcomes["a0"].text.startswith("[revision 0]")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_batch_moves_on_over_its_delay(llm: FakeLLM, provider: str) -> None:
    llm.set_batch_plan(delay_s=1.0)
    requests = requests_for(provider, 3)
    adapter = provider_for(requests[0].agent)
    batch_id = adapter.submit_batch(requests)
    first = adapter.poll_batch(batch_id)
    assert first.state == "in_progress" and first.total == 4 and first.finished < 4
    done = wait_for(lambda: (s := adapter.poll_batch(batch_id)).ended and s, 10, "the batch")
    assert done.finished == done.total == 4


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_failing_or_expired_request_ends_alone(llm: FakeLLM, provider: str) -> None:
    requests = requests_for(provider, 3)
    requests[1] = BatchRequest("a1", requests[1].agent, [{"role": "user", "content": "FAILME now"}])
    requests[2] = BatchRequest(
        "a2", requests[2].agent, [{"role": "user", "content": "EXPIREME now"}]
    )
    llm.set_batch_plan(fail_match="FAILME", fail_status=400, expire_match="EXPIREME")
    outcomes = run_batch(provider, requests)
    failed, lapsed = outcomes["a1"], outcomes["a2"]
    assert (
        isinstance(failed, ProviderError) and failed.kind == "bad_request" and not failed.transient
    )
    assert isinstance(lapsed, ProviderError) and lapsed.kind == "batch_expired" and lapsed.transient
    assert isinstance(outcomes["a0"], Completion) and isinstance(outcomes["c0"], Completion)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_whole_batch_expires(llm: FakeLLM, provider: str) -> None:
    llm.set_batch_plan(delay_s=30.0, expire=True)
    outcomes = run_batch(provider, requests_for(provider, 2))
    assert {type(o) for o in outcomes.values()} == {ProviderError}
    assert {o.kind for o in outcomes.values()} == {"batch_expired"}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cancel_stops_the_unanswered_requests(llm: FakeLLM, provider: str) -> None:
    llm.set_batch_plan(delay_s=30.0)
    requests = requests_for(provider, 3)
    adapter = provider_for(requests[0].agent)
    batch_id = adapter.submit_batch(requests)
    assert adapter.cancel_batch(batch_id).state in ("canceling", "ended")
    wait_for(lambda: adapter.poll_batch(batch_id).ended, 10, "the cancelled batch to end")
    outcomes = adapter.batch_results(batch_id, {r.custom_id: r.structured for r in requests})
    assert {o.kind for o in outcomes.values()} == {"batch_cancelled"}  # type: ignore[union-attr]
    assert llm.stats()["batches"]["cancelled"] == [batch_id]
    assert llm.stats()["usage"]["responses"] == 0  # nothing was answered, nothing billed


@pytest.mark.parametrize("provider", PROVIDERS)
def test_batch_api_errors_are_classified(llm: FakeLLM, provider: str) -> None:
    adapter = provider_for(Agent(ACTOR, model=MODELS[provider]).spec)
    with pytest.raises(ProviderError) as info:
        adapter.poll_batch("batch_nope" if provider == "openai" else "msgbatch_nope")
    assert info.value.kind == "not_found" and not info.value.transient


def test_custom_ids_are_checked() -> None:
    agent = Agent(ACTOR, model="gpt-4o").spec
    with pytest.raises(ConfigError, match="custom_id"):
        BatchRequest("run:r1.critique", agent, [])


RUN_TESTS = ToolSpec(
    name="run_tests",
    description="Run the test suite; the summary line.",
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    pure=True,
)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_tool_turns_go_through_vendor_batches(llm: FakeLLM, provider: str) -> None:
    """A request offering tools comes back asking for a call; the next turn, with the
    call's result, answers; a tool result answering no call is refused, as the vendor's
    API refuses it synchronously."""
    agent = Agent(JUDGE, model=MODELS[provider]).spec.model_copy(
        update={"tools": ("run_tests",), "tool_specs": (RUN_TESTS,)}
    )
    task: Any = {"role": "user", "content": "Review: def add(a, b): return a - b"}
    first = run_batch(provider, [BatchRequest("t1", agent, [task])])["t1"]
    assert isinstance(first, Completion), first
    (call,) = first.tool_calls
    assert call.name == "run_tests" and "code" in call.arguments
    turn: Any = {"role": "assistant", "content": first.text, "tool_calls": [call.as_dict()]}
    answer: Any = {
        "role": "tool",
        "tool_call_id": call.id,
        "name": "run_tests",
        "content": "tests: 1 failed",
        "is_error": False,
    }
    stray: Any = {**answer, "tool_call_id": "call_nobody_made"}
    outcomes = run_batch(
        provider,
        [
            BatchRequest("t2", agent, [task, turn, answer]),
            BatchRequest("bad", agent, [task, {"role": "assistant", "content": "ok"}, stray]),
        ],
    )
    second = outcomes["t2"]
    assert isinstance(second, Completion) and not second.tool_calls
    assert "tests: 1 failed" in second.text
    refused = outcomes["bad"]
    assert isinstance(refused, ProviderError) and refused.status_code == 400, refused
    assert not SYNC_PATHS & set(llm.stats()["by_path"])
