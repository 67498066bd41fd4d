"""Adapters read vendor replies defensively: an odd shape is a clear, permanent error."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from orchestration import Agent, ProviderError
from orchestration.core.structured import CRITIQUE_DESCRIPTION, CRITIQUE_SCHEMA
from workers.providers.anthropic import AnthropicProvider
from workers.providers.openai import OpenAIProvider


class _Client:
    """Stands in for the SDK client: records the post and returns a canned reply (as the
    SDKs do, the raw response when asked for ``httpx2.Response``)."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.posts: list[tuple[str, dict[str, Any]]] = []

    def post(self, path: str, *, body: dict[str, Any], cast_to: Any, options: Any) -> Any:
        self.posts.append((path, body))
        if cast_to is not httpx2.Response:
            return self.reply
        raw = self.reply if isinstance(self.reply, str) else json.dumps(self.reply)
        return httpx2.Response(200, content=raw.encode())


def _adapter(cls: type, reply: Any) -> Any:
    adapter = cls(base_url=None, api_key_env="KEY")
    adapter._client = _Client(reply)
    adapter._http = httpx2.Client()  # what the SDK client is built on: its raw responses
    return adapter


OPENAI_OK = {
    "choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
    "usage": {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 2},
    },
}
ANTHROPIC_OK = {
    "content": [{"type": "text", "text": "h"}, {"type": "tool_use"}, {"type": "text", "text": "i"}],
    "stop_reason": "end_turn",
    "usage": {
        "input_tokens": 5,
        "output_tokens": 3,
        "cache_read_input_tokens": 2,
        "cache_creation_input_tokens": 1,
    },
}


def test_openai_reply_is_read() -> None:
    adapter = _adapter(OpenAIProvider, OPENAI_OK)
    spec = Agent("sys", model="gpt-4o", temperature=0.2, max_tokens=50).spec
    done = adapter.complete(spec, [{"role": "user", "content": "q"}])
    assert (
        done.text,
        done.input_tokens,
        done.output_tokens,
        done.cached_input_tokens,
        done.stop_reason,
    ) == (
        "hi",
        7,
        3,
        2,
        "max_tokens",
    )
    path, body = adapter._client.posts[0]
    assert path == "/chat/completions"
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    assert (body["max_tokens"], body["temperature"]) == (50, 0.2)


def test_openai_reasoning_models_get_max_completion_tokens() -> None:
    adapter = _adapter(OpenAIProvider, OPENAI_OK)
    adapter.complete(
        Agent("s", model="o3-mini", max_tokens=9).spec, [{"role": "user", "content": "q"}]
    )
    body = adapter._client.posts[0][1]
    assert body["max_completion_tokens"] == 9 and "max_tokens" not in body


def test_anthropic_reply_is_read_and_no_temperature_sent() -> None:
    adapter = _adapter(AnthropicProvider, ANTHROPIC_OK)
    # Refused when set up; a spec stored before that rule still sends none.
    spec = Agent("sys", model="claude-haiku-4-5").spec.model_copy(update={"temperature": 0.5})
    done = adapter.complete(spec, [{"role": "user", "content": "q"}])
    # input_tokens include cache reads and writes; cached_input_tokens are the reads.
    assert (
        done.text,
        done.input_tokens,
        done.cached_input_tokens,
        done.cache_write_tokens,
        done.stop_reason,
    ) == ("hi", 8, 2, 1, "end")
    path, body = adapter._client.posts[0]
    assert path == "/v1/messages"
    assert "temperature" not in body
    assert body["system"] == [
        {"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}
    ]


def test_anthropic_marks_the_stable_prefix_for_caching() -> None:
    adapter = _adapter(AnthropicProvider, ANTHROPIC_OK)
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    adapter.complete(
        Agent("sys", model="claude-haiku-4-5").spec, [*history, {"role": "user", "content": "q2"}]
    )
    body = adapter._client.posts[0][1]
    # the last turn before the new prompt ends the cached prefix; the new prompt is plain
    assert body["messages"] == [
        {"role": "user", "content": "q1"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a1", "cache_control": {"type": "ephemeral"}}],
        },
        {"role": "user", "content": "q2"},
    ]
    # with no history only the instructions are marked
    adapter.complete(
        Agent("sys", model="claude-haiku-4-5").spec, [{"role": "user", "content": "q"}]
    )
    assert adapter._client.posts[1][1]["messages"] == [{"role": "user", "content": "q"}]


@pytest.mark.parametrize(
    ("cls", "model", "reply"),
    [
        (OpenAIProvider, "gpt-4o", {"choices": []}),
        (OpenAIProvider, "gpt-4o", {"choices": "nope"}),
        (OpenAIProvider, "gpt-4o", ["not", "a", "dict"]),
        (
            OpenAIProvider,
            "gpt-4o",
            {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "many"}},
        ),
        (AnthropicProvider, "claude-haiku-4-5", {"content": None}),
        (AnthropicProvider, "claude-haiku-4-5", {"stop_reason": "end_turn"}),
        (AnthropicProvider, "claude-haiku-4-5", "plain text"),
    ],
)
def test_odd_replies_are_permanent_bad_response_errors(cls: type, model: str, reply: Any) -> None:
    adapter = _adapter(cls, reply)
    with pytest.raises(ProviderError) as err:
        adapter.complete(Agent("s", model=model).spec, [{"role": "user", "content": "q"}])
    assert err.value.kind == "bad_response"
    assert err.value.transient is False
    assert cls.name in str(err.value)


def test_openai_structured_critique_request_and_reply() -> None:
    reply = {
        "choices": [
            {
                "message": {"content": '{"score": 0.7, "issues": ["x"], "summary": "s"}'},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
    adapter = _adapter(OpenAIProvider, reply)
    done = adapter.complete(
        Agent("judge", model="gpt-4o").spec, [{"role": "user", "content": "q"}], structured=True
    )
    body = adapter._client.posts[0][1]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == CRITIQUE_SCHEMA
    assert body["response_format"]["json_schema"]["strict"] is True
    assert done.structured == {"score": 0.7, "issues": ["x"], "summary": "s"}
    adapter.complete(Agent("judge", model="gpt-4o").spec, [{"role": "user", "content": "q"}])
    assert "response_format" not in adapter._client.posts[1][1]


def test_anthropic_structured_critique_is_a_forced_tool_call() -> None:
    critique = {"score": 0.4, "issues": ["y"], "summary": "t"}
    reply = {
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "critique", "input": critique}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 3},
    }
    adapter = _adapter(AnthropicProvider, reply)
    done = adapter.complete(
        Agent("judge", model="claude-haiku-4-5").spec,
        [{"role": "user", "content": "q"}],
        structured=True,
    )
    body = adapter._client.posts[0][1]
    assert body["tools"] == [
        {"name": "critique", "description": CRITIQUE_DESCRIPTION, "input_schema": CRITIQUE_SCHEMA}
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "critique"}
    assert done.structured == critique and done.stop_reason == "end"
    assert json.loads(done.text) == critique  # kept as text in the conversation


def test_anthropic_reply_without_the_tool_call_has_no_structured_critique() -> None:
    adapter = _adapter(AnthropicProvider, ANTHROPIC_OK)
    done = adapter.complete(
        Agent("judge", model="claude-haiku-4-5").spec,
        [{"role": "user", "content": "q"}],
        structured=True,
    )
    assert done.structured is None and done.text == "hi"  # the text parser takes over
