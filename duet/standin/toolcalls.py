"""Tool calling at the stand-in: what the vendors refuse of a conversation with tool calls
beyond their request types, the conversation read back as the sim model takes it, and the
sim's tool calls written as each vendor writes them."""

from __future__ import annotations

import json
from typing import Any

from orchestration.core.outputs import OUTPUT_NAME
from orchestration.core.structured import CRITIQUE_NAME
from orchestration.core.tools import ToolCall


def openai_problem(body: dict[str, Any]) -> tuple[str, str] | None:
    """What OpenAI refuses of a request's tool messages: a ``tool`` message answering no
    earlier call, an assistant's call with no ``tool`` message after it, a ``tool_choice``
    naming no tool; ``(message, param)`` or None."""
    pending: list[str] = []
    messages = body.get("messages") or []
    for n, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in pending:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{n}].role",
                )
            pending.remove(m["tool_call_id"])
            continue
        if pending:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}",
                "messages",
            )
        if role == "assistant":
            pending = [c.get("id") for c in m.get("tool_calls") or []]
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages "
            f"responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}",
            "messages",
        )
    choice = body.get("tool_choice")
    names = {(t.get("function") or {}).get("name") for t in body.get("tools") or []}
    if isinstance(choice, dict) and (choice.get("function") or {}).get("name") not in names:
        return ("tool_choice names a function that is not in 'tools'", "tool_choice")
    if choice is not None and not body.get("tools"):
        return ("'tool_choice' is only allowed when 'tools' are specified.", "tool_choice")
    return None


def anthropic_problem(body: dict[str, Any]) -> str | None:
    """What Anthropic refuses of a request's tool blocks: a ``tool_result`` with no
    ``tool_use`` in the message before it, a ``tool_use`` with no ``tool_result`` right
    after it, a ``tool_choice`` without tools; the message or None."""
    messages = body.get("messages") or []
    for n, m in enumerate(messages):
        blocks = m.get("content") if isinstance(m.get("content"), list) else []
        uses = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
        if uses:
            after = messages[n + 1] if n + 1 < len(messages) else None
            got = [
                b.get("tool_use_id")
                for b in (
                    after.get("content") if after and isinstance(after.get("content"), list) else []
                )
                if b.get("type") == "tool_result"
            ]
            missing = [u for u in uses if u not in got]
            if missing:
                return (
                    f"messages.{n + 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if results:
            before = messages[n - 1].get("content") if n > 0 else None
            used = [
                b.get("id")
                for b in (before if isinstance(before, list) else [])
                if b.get("type") == "tool_use"
            ]
            stray = [r for r in results if r not in used]
            if stray:
                return (
                    f"messages.{n}.content: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {', '.join(stray)}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
    if body.get("tool_choice") is not None and not body.get("tools"):
        return "tool_choice: may only be specified while providing tools."
    return None


def offered(anthropic: bool, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent's tools a request offers (``name``, ``parameters``), the tool of a
    structured answer (a critique, an actor's output) left out."""
    if anthropic:
        return [
            {"name": t["name"], "parameters": t.get("input_schema") or {}}
            for t in body.get("tools") or []
            if t.get("name") not in (CRITIQUE_NAME, OUTPUT_NAME) and "input_schema" in t
        ]
    return [
        {"name": t["function"]["name"], "parameters": t["function"].get("parameters") or {}}
        for t in body.get("tools") or []
        if t.get("type") == "function"
    ]


def neutral(anthropic: bool, raw_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the sim model reads it (Duet's vendor-neutral messages)."""
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for m in raw_messages:
        role, content = m.get("role"), m.get("content")
        if anthropic and isinstance(content, list):
            texts = "".join(b.get("text", "") for b in content if b.get("type") == "text")
            uses = [b for b in content if b.get("type") == "tool_use"]
            results = [b for b in content if b.get("type") == "tool_result"]
            if uses:
                for b in uses:
                    names[b["id"]] = b["name"]
                calls = [
                    {"id": b["id"], "name": b["name"], "arguments": b.get("input")} for b in uses
                ]
                out.append({"role": "assistant", "content": texts, "tool_calls": calls})
            elif results:
                for b in results:
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": b["tool_use_id"],
                            "name": names.get(b["tool_use_id"], "?"),
                            "content": _text(b.get("content")),
                        }
                    )
            else:
                out.append({"role": role, "content": texts})
        elif role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                names[c["id"]] = c["function"]["name"]
                calls.append(
                    {
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"] or "{}"),
                    }
                )
            out.append({"role": "assistant", "content": _text(content), "tool_calls": calls})
        elif role == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": m["tool_call_id"],
                    "name": names.get(m["tool_call_id"], "?"),
                    "content": _text(content),
                }
            )
        elif role in ("user", "assistant"):
            out.append({"role": role, "content": _text(content)})
    return out


def openai_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """The sim's calls as a Chat Completions reply writes them."""
    return [
        {
            "id": f"call_{c.id}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]


def anthropic_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """The sim's calls as ``tool_use`` blocks."""
    return [
        {"type": "tool_use", "id": f"toolu_{c.id}", "name": c.name, "input": c.arguments}
        for c in calls
    ]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


__all__ = [
    "anthropic_calls",
    "anthropic_problem",
    "neutral",
    "offered",
    "openai_calls",
    "openai_problem",
]
