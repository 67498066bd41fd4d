"""The real openai / anthropic SDKs over HTTP against the local stand-in server.

Adapters come from ``workers.providers.provider_for`` exactly as workers get them; the
endpoints come from ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``, which the SDKs read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import workers.providers as providers
from duet.standin.server import FakeLLM
from orchestration.core.agents import Agent
from orchestration.core.errors import ProviderError
from orchestration.core.structured import CRITIQUE_SCHEMA, read_structured
from orchestration.state import fastpaths
from workers.providers import provider_for

ROOT = Path(__file__).resolve().parents[2]
OPENAI_KEY = "sk-test-Zq81xK2mPw9sECRET"
ANTHROPIC_KEY = "plain-anthropic-secret-5521"
ACTOR = "You are a careful engineer. Answer the task."
CRITIC = 'You are a strict critic. Reply with JSON: {"score": 0..1, "issues": [...]}.'
MODELS = {"openai": "gpt-4o", "anthropic": "claude-haiku-4-5"}
PROVIDERS = list(MODELS)
TASK = [{"role": "user", "content": "Write a function that parses ISO dates."}]


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    """A fresh stand-in server, the SDKs pointed at it, and a fresh adapter registry."""
    with FakeLLM() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.anthropic_url)
        monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
        monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        for var in ("ANTHROPIC_AUTH_TOKEN", "OPENAI_CUSTOM_HEADERS", "ANTHROPIC_CUSTOM_HEADERS"):
            monkeypatch.delenv(var, raising=False)
        adapters: dict[Any, Any] = {}
        monkeypatch.setattr(providers, "_adapters", adapters)
        yield server
        for adapter in adapters.values():
            adapter.close()


def agent(provider: str, instructions: str = ACTOR, **kwargs: Any) -> Agent:
    return Agent(instructions, model=MODELS[provider], **kwargs)


def call(a: Agent, messages: list[Any] = TASK) -> Any:
    return provider_for(a.spec).complete(a.spec, messages)


def fails(a: Agent) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        call(a)
    return info.value


@pytest.mark.parametrize("provider", PROVIDERS)
def test_completion_usage_equals_what_server_sent(llm: FakeLLM, provider: str) -> None:
    first = call(agent(provider))
    second = call(agent(provider), [*TASK, {"role": "assistant", "content": first.text}, *TASK])
    assert first.text.startswith("[revision 0] Answer to: Write a function")
    assert first.stop_reason == second.stop_reason == "end"
    assert first.raw_stop_reason == ("stop" if provider == "openai" else "end_turn")
    sent = llm.stats()["usage"]
    assert sent["responses"] == 2
    assert first.input_tokens + second.input_tokens == sent["input_tokens"]
    assert first.output_tokens + second.output_tokens == sent["output_tokens"]
    assert second.input_tokens > first.input_tokens > 0
    assert first.cached_input_tokens == 0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_request_carries_system_prompt_and_limits(llm: FakeLLM, provider: str) -> None:
    call(agent(provider, max_tokens=333))
    [last] = llm.last_requests
    body = last["body"]
    assert last["model"] == MODELS[provider]
    if provider == "openai":
        assert last["path"] == "/v1/chat/completions"
        assert body["messages"][0] == {"role": "system", "content": ACTOR}
        assert body["messages"][1:] == TASK
        assert body["max_tokens"] == 333
    else:
        assert last["path"] == "/v1/messages"
        assert body["system"] == [
            {"type": "text", "text": ACTOR, "cache_control": {"type": "ephemeral"}}
        ]
        assert body["messages"] == TASK
        assert body["max_tokens"] == 333


def _turns(n: int) -> list[Any]:
    """A conversation of ``n`` earlier exchanges, ~250 tokens each, and a new prompt."""
    history: list[Any] = []
    for i in range(n):
        history += [
            {"role": "user", "content": f"Task {i}: " + "review this code carefully. " * 30},
            {"role": "assistant", "content": f"[revision {i}] " + "the answer is fine. " * 20},
        ]
    return [*history, {"role": "user", "content": f"Task {n}: one more."}]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_repeated_prefix_is_read_from_the_prompt_cache(llm: FakeLLM, provider: str) -> None:
    """A conversation that grows turn by turn: its earlier turns come from the cache."""
    a = agent(provider)
    first = call(a, _turns(6))  # ~1500 tokens of history
    second = call(a, _turns(7))
    third = call(a, _turns(8))
    assert first.cached_input_tokens == 0
    if provider == "anthropic":  # the marked prefix is written, then read
        assert first.cache_write_tokens > 1024
        assert second.cached_input_tokens == first.cache_write_tokens
        assert third.cached_input_tokens == second.cached_input_tokens + second.cache_write_tokens
    else:  # automatic: the whole earlier prompt, in steps of 128 tokens
        assert first.cache_write_tokens == second.cache_write_tokens == 0
        assert second.cached_input_tokens >= 1024 and (second.cached_input_tokens - 1024) % 128 == 0
        assert third.cached_input_tokens > second.cached_input_tokens
    assert 0 < second.cached_input_tokens < second.input_tokens
    sent = llm.stats()["usage"]
    done = (first, second, third)
    assert sent["cached_input_tokens"] == sum(c.cached_input_tokens for c in done)
    assert sent["cache_write_tokens"] == sum(c.cache_write_tokens for c in done)
    assert sent["input_tokens"] == sum(c.input_tokens for c in done)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_prompt_cache_is_per_key_and_short_prompts_are_not_cached(
    llm: FakeLLM, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = agent(provider)
    call(a, TASK)
    assert call(a, TASK).cached_input_tokens == 0  # far below the 1024-token minimum
    call(a, _turns(6))
    assert call(a, _turns(6)).cached_input_tokens > 0
    monkeypatch.setenv(f"{provider.upper()}_API_KEY", "another-organisation-key")
    providers.reset_providers()
    assert call(a, _turns(6)).cached_input_tokens == 0


JUDGE = "Review the answer and list its problems."  # no word of JSON or of a score


@pytest.mark.parametrize("provider", PROVIDERS)
def test_structured_critique_is_asked_and_read_natively(llm: FakeLLM, provider: str) -> None:
    a = agent(provider, JUDGE)
    done = provider_for(a.spec).complete(
        a.spec, [{"role": "user", "content": "[revision 1] my answer"}], structured=True
    )
    body = llm.last_requests[-1]["body"]
    if provider == "openai":
        schema = body["response_format"]["json_schema"]
        assert (schema["name"], schema["strict"], schema["schema"]) == (
            "critique",
            True,
            CRITIQUE_SCHEMA,
        )
    else:
        assert body["tools"][0]["input_schema"] == CRITIQUE_SCHEMA
        assert body["tool_choice"] == {"type": "tool", "name": "critique"}
        assert done.raw_stop_reason == "tool_use"
    assert done.stop_reason == "end"
    assert done.structured is not None and set(done.structured) == {"score", "issues", "summary"}
    reading = read_structured(done.structured)
    assert reading is not None and reading.complete
    assert reading.critique.score == done.structured["score"] and 0 < reading.critique.score <= 1
    assert llm.stats()["usage"]["input_tokens"] == done.input_tokens  # the schema is billed too
    # the same critic asked for text answers as the actor would: nothing native to read
    plain = call(a, [{"role": "user", "content": "[revision 1] my answer"}])
    assert plain.structured is None and plain.input_tokens < done.input_tokens


def test_openai_temperature_sent_only_when_set(llm: FakeLLM) -> None:
    call(agent("openai", temperature=0.3))
    call(agent("openai"))
    first, second = (r["body"] for r in llm.last_requests)
    assert first["temperature"] == 0.3 and "temperature" not in second


def test_openai_reasoning_model_uses_max_completion_tokens(llm: FakeLLM) -> None:
    a = Agent(ACTOR, model="o4-mini", max_tokens=77)
    call(a)
    body = llm.last_requests[-1]["body"]
    assert body["max_completion_tokens"] == 77 and "max_tokens" not in body


def test_openai_compatible_server_without_key(
    llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    a = Agent(ACTOR, model="openai:llama3.1", base_url=llm.url)
    done = call(a)
    assert done.stop_reason == "end" and done.output_tokens > 0
    assert llm.stats()["by_model"] == {"llama3.1": 1}


def test_anthropic_base_url_per_agent(llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Anthropic-compatible gateway for one agent, no process-wide variable needed."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    with FakeLLM() as gateway:
        a = Agent(ACTOR, model="anthropic:claude-haiku-4-5", base_url=gateway.anthropic_url)
        done = call(a)
        assert done.stop_reason == "end" and done.output_tokens > 0
        assert gateway.stats()["by_path"] == {"/v1/messages": 1}
    assert llm.stats()["requests"] == 0
    # The same model without base_url goes where the environment says (and fails there).
    assert fails(Agent(ACTOR, model="anthropic:claude-haiku-4-5")).kind == "connection"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_critic_role_inferred_from_instructions(llm: FakeLLM, provider: str) -> None:
    done = call(agent(provider, CRITIC), [{"role": "user", "content": "[revision 1] my answer"}])
    review = json.loads(done.text)
    assert 0 <= review["score"] <= 1 and isinstance(review["issues"], list)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rate_limited_with_retry_after(llm: FakeLLM, provider: str) -> None:
    llm.set_faults(status=429, times=1, retry_after="7")
    err = fails(agent(provider))
    assert (err.kind, err.transient, err.retry_after, err.status_code) == (
        "rate_limited",
        True,
        7.0,
        429,
    )
    # max_retries=0: the SDK did not retry on its own; the next call goes through
    assert llm.stats()["requests"] == 1
    assert call(agent(provider)).stop_reason == "end"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_retry_after_ms(llm: FakeLLM, provider: str) -> None:
    llm.set_faults(status=529, retry_after_ms="1500")
    err = fails(agent(provider))
    assert (err.kind, err.transient, err.retry_after) == ("overloaded", True, 1.5)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_server_error_is_transient(llm: FakeLLM, provider: str) -> None:
    llm.set_faults(status=500)
    err = fails(agent(provider))
    assert (err.kind, err.transient, err.status_code) == ("server_error", True, 500)
    assert llm.stats()["requests"] == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_auth_error_is_permanent_and_hides_the_key(llm: FakeLLM, provider: str) -> None:
    llm.set_faults(
        status=401
    )  # the stand-in echoes the key it was sent, as a careless server might
    err = fails(agent(provider))
    assert (err.kind, err.transient, err.status_code) == ("auth", False, 401)
    assert "Incorrect API key provided" in str(err)
    for secret in (OPENAI_KEY, ANTHROPIC_KEY, "Zq81xK2m", "anthropic-secret"):
        assert secret not in str(err) and secret not in repr(err.args)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_bad_request_is_permanent(llm: FakeLLM, provider: str) -> None:
    llm.set_faults(status=400, message="messages: field required")
    err = fails(agent(provider))
    assert (err.kind, err.transient) == ("bad_request", False)
    assert "field required" in str(err)


#: Faults and the error each is: (kind, transient, retry_after, status_code).
FAULTS = [
    ({"status": 429, "retry_after": "7"}, ("rate_limited", True, 7.0, 429)),
    ({"status": 529, "retry_after_ms": "1500"}, ("overloaded", True, 1.5, 529)),
    ({"status": 500}, ("server_error", True, None, 500)),
    ({"status": 401}, ("auth", False, None, 401)),
    ({"status": 400, "message": "messages: field required"}, ("bad_request", False, None, 400)),
    ({"drop": 1}, ("connection", True, None, None)),
    ({"delays_ms": [2000]}, ("timeout", True, None, None)),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("fault", "expected"), FAULTS, ids=[str(f) for f, _ in FAULTS])
def test_a_later_call_fails_as_the_first(
    llm: FakeLLM, provider: str, fault: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    """The first call goes through the SDK's ``client.post``; later ones go out on the SDK
    client's HTTP pool with the URL and headers the first went with. A failure of a later
    call is the same error, with the vendor's message and without the key."""
    a = agent(provider, timeout_s=0.5)
    errors = []
    for _ in range(2):  # the first call (through the SDK), then a later one
        llm.set_faults(**fault)
        with pytest.raises(ProviderError) as info:
            call(a)
        errors.append(info.value)
        llm.clear_faults()
        assert call(a).stop_reason == "end"
    # The later calls went direct, where the endpoint fast path runs (else through the SDK).
    assert (provider_for(a.spec)._endpoint is not None) is fastpaths.enabled("endpoint")
    for err in errors:
        assert (err.kind, err.transient, err.retry_after, err.status_code) == expected
        for secret in (OPENAI_KEY, ANTHROPIC_KEY, "Zq81xK2m", "anthropic-secret"):
            assert secret not in str(err) and secret not in repr(err.args)
    if fault.get("status") == 401:
        assert all("Incorrect API key provided" in str(err) for err in errors)
    if fault.get("status") == 400:
        assert all("field required" in str(err) for err in errors)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_truncation_is_max_tokens(llm: FakeLLM, provider: str) -> None:
    done = call(agent(provider, max_tokens=5))
    assert done.stop_reason == "max_tokens"
    assert done.raw_stop_reason == ("length" if provider == "openai" else "max_tokens")
    assert done.output_tokens == 5 and len(done.text) == 20


@pytest.mark.parametrize("provider", PROVIDERS)
def test_missing_key(llm: FakeLLM, provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    err = fails(agent(provider))
    assert (err.kind, err.transient) == ("missing_key", False)
    assert ("OPENAI_API_KEY" if provider == "openai" else "ANTHROPIC_API_KEY") in str(err)
    assert llm.stats()["requests"] == 0
    # a custom variable is named too, and setting it later makes the adapter work
    custom = agent(provider, api_key_env="DUET_TEST_VENDOR_KEY")
    with pytest.raises(ProviderError, match="DUET_TEST_VENDOR_KEY"):
        call(custom)
    monkeypatch.setenv("DUET_TEST_VENDOR_KEY", "later-key")
    assert call(custom).stop_reason == "end"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_dropped_connection_is_transient(llm: FakeLLM, provider: str) -> None:
    llm.set_faults(drop=1)
    err = fails(agent(provider))
    assert (err.kind, err.transient, err.status_code) == ("connection", True, None)
    assert llm.stats()["dropped"] == 1
    assert call(agent(provider)).stop_reason == "end"  # a new connection works


@pytest.mark.parametrize("provider", PROVIDERS)
def test_timeout_is_transient(llm: FakeLLM, provider: str) -> None:
    llm.set_faults(delays_ms=[2000])
    err = fails(agent(provider, timeout_s=0.2))
    assert (err.kind, err.transient) == ("timeout", True)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_one_client_reused_across_calls(llm: FakeLLM, provider: str) -> None:
    a = agent(provider)
    adapter = provider_for(a.spec)
    call(a)
    client = adapter.client()
    for _ in range(3):
        call(agent(provider, max_tokens=100))  # another agent, same (provider, url, key var)
    assert provider_for(a.spec) is adapter
    assert adapter.client() is client
    stats = llm.stats()
    # Keep-alive: the SDK's connection for the first call, then this thread's own for the
    # later ones (workers.providers.endpoint; the SDK's one where that fast path is off).
    assert stats["requests"] == 4 and stats["connections"] == 1 + fastpaths.enabled("endpoint")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_concurrent_first_calls_share_one_client(llm: FakeLLM, provider: str) -> None:
    a = agent(provider)
    adapter = provider_for(a.spec)
    clients: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        try:
            barrier.wait()
            call(a)
            clients.append(adapter.client())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(clients) == 8 and all(c is clients[0] for c in clients)
    assert llm.stats()["requests"] == 8


def _admin(llm: FakeLLM, path: str, payload: Any = None) -> tuple[int, Any]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(llm.base + path, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_admin_api_every_nth_and_reset(llm: FakeLLM) -> None:
    status, body = _admin(llm, "/_admin/faults", {"status": 503, "every": 2, "latency_ms": 1})
    assert status == 200 and body["faults"] == {"status": 503, "every": 2}
    results = []
    for _ in range(4):
        try:
            results.append(call(agent("openai")).stop_reason)
        except ProviderError as err:
            results.append(err.kind)
    assert results == ["end", "server_error", "end", "server_error"]
    _, stats = _admin(llm, "/_admin/stats")
    assert stats["requests"] == 4 and stats["faulted"] == 2 and stats["latency_ms"] == 1
    assert stats["by_status"] == {"200": 2, "503": 2}
    assert stats["by_path"] == {"/v1/chat/completions": 4}
    times = [a["t"] for a in stats["arrivals"]]
    assert len(times) == 4 and times == sorted(times)
    assert _admin(llm, "/_admin/faults", {"bogus": 1})[0] == 400
    assert _admin(llm, "/_admin/reset", {})[0] == 200
    _, stats = _admin(llm, "/_admin/stats")
    assert stats["requests"] == 0 and stats["faults"] == {} and stats["latency_ms"] == 0


def test_faults_filtered_by_path(llm: FakeLLM) -> None:
    llm.set_faults(status=500, path="/v1/messages")
    assert call(agent("openai")).stop_reason == "end"
    assert fails(agent("anthropic")).kind == "server_error"


def test_sdks_not_imported_until_first_call() -> None:
    code = (
        "import sys, workers.providers.openai, workers.providers.anthropic, duet.standin.server\n"
        "assert 'openai' not in sys.modules and 'anthropic' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT, timeout=60)


def test_the_first_call_asks_for_the_raw_response_of_the_sdks_own_http_library() -> None:
    """The SDKs post with httpx2 since their 2.x/3.x lines and with httpx before; the first
    call asks for the raw response of whichever the SDK's client is built on (CI's
    oldest-releases job runs every provider test on the httpx one)."""
    import httpx2

    from workers.providers.sdk import response_type

    class Client(httpx2.Client):
        pass

    assert response_type(Client()) is httpx2.Response
    with pytest.raises(TypeError, match="object is not a client of httpx2 or httpx"):
        response_type(object())
