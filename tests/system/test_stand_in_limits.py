"""The stand-in enforces a rate limit as the vendors do, and Duet's adapters read it back:
over the limit a 429 with ``retry-after`` (and ``retry-after-ms`` at OpenAI); on every
answer the vendor's rate-limit headers, which the adapters turn into the account's limit,
whether the call went through the SDK (the first) or the endpoint (later ones)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime

import anthropic
import openai
import pytest

from duet.standin.server import FakeLLM
from orchestration.core.agents import Agent
from orchestration.core.errors import ProviderError
from orchestration.core.ratelimit import VendorLimits
from tests.support import environment, wait_for
from workers.providers.anthropic import AnthropicProvider
from workers.providers.openai import OpenAIProvider

pytestmark = pytest.mark.system

KEY = "sk-test-not-a-secret"


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    """A stand-in of the test's own: the 429s it sends count in no other test's. Its
    request schemas are built first, so no answer waits for them while a bucket refills."""
    from duet.standin.schemas import warm

    warm()
    with FakeLLM() as server:
        yield server


def _fresh(llm) -> None:
    """A full bucket: 2 requests (120 a minute is 2 a second)."""
    llm.set_limits(rpm=120, tpm=600_000)


def test_openai_style_429_and_headers(llm) -> None:
    _fresh(llm)
    client = openai.OpenAI(base_url=llm.url, api_key=KEY, max_retries=0)
    ask = lambda: client.chat.completions.with_raw_response.create(  # noqa: E731
        model="gpt-4.1", messages=[{"role": "user", "content": "hi"}], max_tokens=50
    )
    try:
        first = ask()
        assert first.headers["x-ratelimit-limit-requests"] == "120"
        assert first.headers["x-ratelimit-limit-tokens"] == "600000"
        assert int(first.headers["x-ratelimit-remaining-requests"]) < 120
        assert first.headers["x-ratelimit-reset-requests"].endswith("ms")
        ask()
        with pytest.raises(openai.RateLimitError) as refused:
            ask()
        headers = refused.value.response.headers
        assert headers["retry-after"] == "1"
        assert 0 < int(headers["retry-after-ms"]) <= 1000
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert llm.stats()["rate_limited"] >= 1
    finally:
        llm.set_limits()


def test_anthropic_style_429_and_headers(llm) -> None:
    _fresh(llm)
    client = anthropic.Anthropic(base_url=llm.anthropic_url, api_key=KEY, max_retries=0)
    ask = lambda: client.messages.with_raw_response.create(  # noqa: E731
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}], max_tokens=50
    )
    try:
        first = ask()
        for family in ("requests", "tokens", "input-tokens", "output-tokens"):
            assert first.headers[f"anthropic-ratelimit-{family}-limit"]
            assert first.headers[f"anthropic-ratelimit-{family}-remaining"]
            reset = first.headers[f"anthropic-ratelimit-{family}-reset"]
            assert datetime.fromisoformat(reset.replace("Z", "+00:00")).tzinfo is not None
        assert first.headers["anthropic-ratelimit-requests-limit"] == "120"
        ask()
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask()
        assert refused.value.response.headers["retry-after"] == "1"
        assert "retry-after-ms" not in refused.value.response.headers
    finally:
        llm.set_limits()


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_the_adapters_learn_the_limit_from_every_answer(llm, vendor: str) -> None:
    if vendor == "openai":
        agent = Agent("x", model="openai:gpt-4.1", base_url=llm.url, api_key_env="K").spec
        adapter = OpenAIProvider(base_url=agent.base_url, api_key_env="K")
    else:
        agent = Agent(
            "x",
            model="anthropic:claude-sonnet-4-5",
            base_url=llm.anthropic_url,
            api_key_env="K",
        ).spec
        adapter = AnthropicProvider(base_url=agent.base_url, api_key_env="K")
    messages = [{"role": "user", "content": "hi"}]
    _fresh(llm)
    try:
        with environment({"K": KEY}):
            # the first call goes through the SDK, the second on the endpoint it showed
            learned = [adapter.complete(agent, messages).limits for _ in range(2)]
            assert learned == [VendorLimits(rpm=120, tpm=600_000)] * 2
            with pytest.raises(ProviderError) as refused:
                adapter.complete(agent, messages)
            assert refused.value.kind == "rate_limited" and refused.value.retry_after
            assert refused.value.limits == VendorLimits(rpm=120, tpm=600_000)
            llm.set_limits()  # no limit: the answer states none
            assert adapter.complete(agent, messages).limits == VendorLimits()
    finally:
        llm.set_limits()
        adapter.close()


def test_fake_llm_command_enforces_rpm() -> None:
    """``duet fake-llm --rpm`` serves with the limit (one a minute: the second is refused)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "duet", "fake-llm", "--port", str(port), "--rpm", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)

        def up() -> bool:
            try:
                client.models.with_raw_response.list()
            except openai.APIConnectionError:
                return False
            except openai.APIStatusError:
                return True
            return True

        wait_for(up, 30, "the stand-in")
        ask = lambda: client.chat.completions.create(  # noqa: E731
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        ask()
        with pytest.raises(openai.RateLimitError):
            ask()
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_fleet_learns_the_limit_and_limits_show_says_so(
    worker, system_redis_url: str, llm, tmp_path
) -> None:
    """A model nobody configured a limit for: after one run against a vendor stating 600
    requests a minute, the fleet paces at that and ``duet limits show`` says what it
    learned, for which endpoint, and how long ago."""
    import os

    from orchestration import Team
    from orchestration.core.ratelimit import limit_name
    from orchestration.state.ratelimits import limit_state
    from tests.support import client_pointed_at

    model = "openai:learned-limit-model"  # its own name: the state touches no other test
    llm.set_limits(rpm=600)
    try:
        with client_pointed_at(system_redis_url):
            team = Team.actor_critic(
                actor=Agent("Fix.", model=model, base_url=llm.url),
                critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=llm.url),
                max_rounds=1,
            )
            assert team.submit("a snippet").result(timeout=60).status == "approved"
            from orchestration.client.handles import store

            state = limit_state(store().r, limit_name("openai", "learned-limit-model", llm.url))
    finally:
        llm.set_limits()
    assert (state.learned_rpm, state.learned_tpm, state.permits) == (600, None, 0)
    shown = subprocess.run(
        [sys.executable, "-m", "duet", "limits", "show"],
        env={**os.environ, "DUET_REDIS_URL": system_redis_url, "COLUMNS": "250"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if "learned-limit-model" in line)
    assert f"learned-limit-model@{llm.url}" in row
    assert "600 rpm (" in row and "s ago)" in row, row
