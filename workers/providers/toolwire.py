"""Tool calling on the wire: Duet's vendor-neutral turns (``Message`` with ``tool_calls``
and ``tool`` messages) as OpenAI's function calling and Anthropic's tool use write them,
and the tool calls read back from each vendor's reply."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from orchestration.core.completion import Message
from orchestration.core.tools import ToolCall, ToolSpec, arguments_text

#: The argument a call whose arguments were not a JSON object is given instead: no tool
#: declares it, so the tool's schema refuses it and the model reads why.
BAD_ARGUMENTS = "__unreadable_arguments__"


def openai_tools(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """``tools`` of a Chat Completions request."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in specs
    ]


def openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages (``tool_calls``, ``tool`` role)."""
    sent: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            sent.append(
                {"role": "tool", "tool_call_id": m.get("tool_call_id", ""), "content": m["content"]}
            )
        elif m["role"] == "assistant" and m.get("tool_calls"):
            sent.append(
                {
                    "role": "assistant",
                    "content": m["content"] or None,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {
                                "name": c["name"],
                                "arguments": arguments_text(c.get("arguments") or {}),
                            },
                        }
                        for c in m.get("tool_calls", [])
                    ],
                }
            )
        else:
            sent.append({"role": m["role"], "content": m["content"]})
    return sent


def openai_calls(message: dict[str, Any]) -> tuple[ToolCall, ...]:
    """The function calls of a Chat Completions reply's message."""
    calls = []
    for call in message.get("tool_calls") or []:
        if call.get("type", "function") != "function":
            continue
        function = call.get("function") or {}
        calls.append(
            ToolCall(str(call["id"]), str(function["name"]), _arguments(function.get("arguments")))
        )
    return tuple(calls)


def anthropic_tools(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """``tools`` of a Messages request."""
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in specs
    ]


def anthropic_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as Messages API turns: ``tool_use`` blocks in the assistant's turn,
    the results as ``tool_result`` blocks of one user turn."""
    sent: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id", ""),
                "content": m["content"],
                "is_error": bool(m.get("is_error")),
            }
            last = sent[-1] if sent else None
            if last and last["role"] == "user" and isinstance(last["content"], list):
                last["content"].append(block)
            else:
                sent.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            blocks: list[dict[str, Any]] = []
            if m["content"]:
                blocks.append({"type": "text", "text": m["content"]})
            blocks.extend(
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["name"],
                    "input": c.get("arguments") or {},
                }
                for c in m.get("tool_calls", [])
            )
            sent.append({"role": "assistant", "content": blocks})
        else:
            sent.append({"role": m["role"], "content": m["content"]})
    return sent


def anthropic_calls(
    content: Sequence[dict[str, Any]], skip: Collection[str] = ()
) -> tuple[ToolCall, ...]:
    """The ``tool_use`` blocks of a Messages reply (but the tools named in ``skip``)."""
    return tuple(
        ToolCall(
            str(b["id"]),
            str(b["name"]),
            b["input"] if isinstance(b.get("input"), dict) else {BAD_ARGUMENTS: b.get("input")},
        )
        for b in content
        if b.get("type") == "tool_use" and b.get("id") and b.get("name") not in (None, *skip)
    )


def _arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments: a JSON object (OpenAI sends it as text)."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {BAD_ARGUMENTS: str(raw)[:200]}
    return value if isinstance(value, dict) else {BAD_ARGUMENTS: value}


__all__ = [
    "anthropic_calls",
    "anthropic_messages",
    "anthropic_tools",
    "openai_calls",
    "openai_messages",
    "openai_tools",
]
