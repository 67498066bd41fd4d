"""The offline simulated model: deterministic, stateless, no network.

Model strings: ``sim``, ``sim?latency_ms=20``, ``sim:critic?scores=0.3,0.6,0.95&format=fenced``.
The part after ``sim:`` is the role (``actor`` or ``critic``); the loop fills it in from
the agent's place when it is left out. Options (any role):

``latency_ms``   sleep this long per call, like a model's wall time (default 0)
``scores``       critic: score for revision 0, 1, 2...; the last repeats (default: from a
                 hash of the prompt in [0.35, 0.95], +0.2 a revision, so a batch has variety)
``format``       critic reply: ``json`` (default), ``fenced``, ``prose``, ``fraction``
                 (``"7/10"``), ``percent`` (``"85%"``), ``text`` (no JSON, ``Score: 9/10``),
                 ``garbage`` (no JSON, no score); an actor with an ``output_schema``
                 answers an instance of it, or with ``garbage``/``text``/``prose`` its
                 plain text (which breaks the schema)
``quote``        critic: quote every line of its prompt holding ``"score"`` (a forged
                 verdict in the reviewed text, say). ``before``: before the verdict,
                 outside any markers (inline; in a fence for ``format=fenced``);
                 ``after``: after it, between the prompt's own quoting markers
``truncate_at``  cut the reply at ``max_tokens`` when working on this revision
``fail_at``      raise a provider error when working on this revision...
``fail``         ...of this kind: ``auth`` (permanent), ``server_error`` (transient),
                 ``rate_limited`` (transient), ``bad_request`` (permanent)
``words``        length of an actor draft in words (default 60)
``refuse_at``    stop the reply as a vendor would when working on this revision...
``refuse``       ...with this outcome: ``refusal`` (default; the text is the refusal),
                 ``content_filter`` or ``context_window`` (the text is cut in half)
``issue``        critic: this issue text instead of the generated ones (while unapproved)
``when``         critic: approve (score 1.0, no issue) unless the output it reviews (between
                 its markers) holds this text: a finding only where the flaw is
``echo``         actor (``1``): reply with the last non-diff fenced block of the prompt, fenced
``replace``      actor with ``echo``: ``OLD=>NEW`` replaced in the echoed text (a scripted fix)
``call``         with tools offered: the tools its first turn calls, comma-separated, all at
                 once (default: the first tool offered); ``-`` calls none
``args``         a JSON object: tool name -> the arguments it is called with, or a list of
                 them (one call each); default: each required argument from its schema (a
                 string is the output under review)
``tool_turns``   turns that ask for tools before the answer (default 1)

With tools offered, an agent's first ``tool_turns`` turns call tools; its answer then
quotes each tool's result as an issue (critic) or a line (actor).

The actor marks each revision (``[revision N]``); the critic scores by the revision it
reads. Both depend only on their input, so any worker — or the stand-in HTTP server —
gives the same answer. Usage is counted as one token per four characters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl

from orchestration.core.agents import AgentSpec
from orchestration.core.errors import ConfigError, ProviderError
from orchestration.core.tools import ToolCall
from workers.providers.base import Completion, Message, Provider

_REVISION = re.compile(r"\[revision (\d+)\]")
_MARKER = re.compile(r"<<<DUET-OUTPUT-[0-9a-f]+>>>")
_FORMATS = ("json", "fenced", "prose", "fraction", "percent", "text", "garbage")
_FAILURES = {
    "auth": (False, 401),
    "bad_request": (False, 400),
    "server_error": (True, 500),
    "rate_limited": (True, 429),
}
_REFUSALS = ("refusal", "content_filter", "context_window")
#: How much of each tool result an answer quotes: lines, then characters.
_QUOTED_LINES, _QUOTED_CHARS = 12, 1000
#: What the simulated model says when it refuses.
REFUSAL_TEXT = "I can't help with that request."
_TOPICS = (
    "input validation",
    "error handling",
    "resource cleanup",
    "injection safety",
    "boundary conditions",
    "logging of secrets",
    "concurrency",
    "test coverage",
)


@dataclass(frozen=True)
class SimOptions:
    """Parsed ``sim[:role][?options]`` string."""

    role: str = "actor"
    latency_ms: float = 0.0
    scores: tuple[float, ...] | None = None
    format: str = "json"
    quote: str = ""
    truncate_at: int | None = None
    fail_at: int | None = None
    fail: str = "server_error"
    words: int = 60
    refuse_at: int | None = None
    refuse: str = "refusal"
    issue: str = ""
    when: str = ""
    echo: bool = False
    replace: tuple[str, str] | None = None
    call: tuple[str, ...] | None = None
    args: tuple[tuple[str, str], ...] = ()
    tool_turns: int = 1


@lru_cache(maxsize=256)
def parse_sim_model(model: str) -> SimOptions:
    """Parse a ``sim`` model string; unknown roles, options or values raise ConfigError."""
    head, _, query = model.partition("?")
    name, _, role = head.partition(":")
    if name != "sim":
        raise ConfigError(f"not a sim model: {model!r}")
    role = role or "actor"
    if role not in ("actor", "critic"):
        raise ConfigError(f"sim role must be 'actor' or 'critic', got {role!r} in {model!r}")
    opts: dict[str, object] = {"role": role}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        try:
            if key == "latency_ms":
                opts[key] = float(value)
            elif key == "scores":
                opts[key] = tuple(float(s) for s in value.split(",") if s.strip())
            elif key == "format":
                if value not in _FORMATS:
                    raise ValueError(f"one of {', '.join(_FORMATS)}")
                opts[key] = value
            elif key == "quote":
                if value not in ("before", "after"):
                    raise ValueError("before or after")
                opts[key] = value
            elif key in ("truncate_at", "fail_at", "words", "refuse_at"):
                opts[key] = int(value)
            elif key == "fail":
                if value not in _FAILURES:
                    raise ValueError(f"one of {', '.join(_FAILURES)}")
                opts[key] = value
            elif key in ("issue", "when"):
                opts[key] = value
            elif key == "echo":
                opts[key] = value in ("1", "true", "yes")
            elif key == "replace":
                old, sep, new = value.partition("=>")
                if not sep or not old:
                    raise ValueError("OLD=>NEW")
                opts[key] = (old, new)
            elif key == "call":
                opts[key] = tuple(n.strip() for n in value.split(",") if n.strip() and n != "-")
            elif key == "args":
                found = json.loads(value)
                if not isinstance(found, dict) or not all(
                    isinstance(v, dict)
                    or (isinstance(v, list) and all(isinstance(a, dict) for a in v))
                    for v in found.values()
                ):
                    raise ValueError("a JSON object of tool name -> arguments (or a list)")
                opts[key] = tuple((k, json.dumps(v)) for k, v in found.items())
            elif key == "tool_turns":
                opts[key] = int(value)
            elif key == "refuse":
                if value not in _REFUSALS:
                    raise ValueError(f"one of {', '.join(_REFUSALS)}")
                opts[key] = value
            else:
                raise ValueError("unknown option")
        except ValueError as exc:
            raise ConfigError(f"sim model {model!r}: bad option {key}={value!r}: {exc}") from exc
    return SimOptions(**opts)  # type: ignore[arg-type]


def tokens(text: str) -> int:
    """The simulator's token count: one token per four characters, at least one."""
    return max(1, math.ceil(len(text) / 4))


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _revision_in(text: str) -> int:
    found = _REVISION.findall(text)
    return max(int(n) for n in found) if found else -1


def _actor_reply(opts: SimOptions, task: str, revision: int) -> str:
    seed = _digest(task)
    first_line = task.strip().splitlines()[0][:120] if task.strip() else "(empty prompt)"
    filler = " ".join(_TOPICS[(seed + i) % len(_TOPICS)].split()[0] for i in range(opts.words))
    return (
        f"[revision {revision}] Answer to: {first_line}\n"
        f"This draft handles {_TOPICS[seed % len(_TOPICS)]} and {_TOPICS[(seed >> 8) % len(_TOPICS)]}.\n"
        f"{filler}\n"
    )


def _critic_score(opts: SimOptions, reviewed: str, revision: int) -> float:
    if opts.scores:
        return opts.scores[min(max(revision, 0), len(opts.scores) - 1)]
    # No schedule: start somewhere in [0.35, 0.95] by the reviewed text's task, +0.2 a
    # revision, so a batch shows every outcome (approved at once, later, or never).
    task = reviewed.split("\n", 1)[0].replace(f"[revision {revision}]", "")
    base = 0.35 + (_digest(task) % 61) / 100
    return round(min(1.0, base + 0.2 * max(revision, 0)), 2)


_FENCED = re.compile(r"^(`{3,})([^\n`]*)\n(.*?)^\1[ \t]*$", re.S | re.M)


def _echo_reply(opts: SimOptions, task: str, revision: int) -> str:
    """The last fenced block of ``task`` that is not a diff, fenced again (``echo``)."""
    blocks = [b for b in _FENCED.findall(task) if b[1].strip() != "diff"]
    body = blocks[-1][2] if blocks else ""
    if opts.replace is not None:
        body = body.replace(*opts.replace)
    return f"[revision {revision}]\n```\n{body}```\n"


def _critic_reply(
    opts: SimOptions, score: float, revision: int, quotes: list[str] | None = None
) -> str:
    issues = (
        []
        if score >= 0.9
        else [opts.issue]
        if opts.issue
        else [
            f"{_TOPICS[(revision + i) % len(_TOPICS)].capitalize()} is incomplete (revision {revision})"
            for i in range(2 if score < 0.6 else 1)
        ]
    )
    issues = [*(quotes or []), *issues]
    summary = f"Revision {revision} scores {score:.2f}."
    payload = {"score": score, "issues": issues, "summary": summary}
    fmt = opts.format
    if fmt == "fraction":
        payload["score"] = f"{round(score * 10, 1):g}/10"
    elif fmt == "percent":
        payload["score"] = f"{round(score * 100):d}%"
    body = json.dumps(payload)
    if fmt == "fenced":
        return f"Here is my review.\n```json\n{body}\n```\n"
    if fmt == "prose":
        return f"I reviewed the output carefully. My verdict: {body} Hope this helps."
    if fmt == "text":
        bullets = "\n".join(f"- {i}" for i in issues) or "- none"
        return f"Review of revision {revision}.\n{bullets}\nScore: {round(score * 10, 1):g}/10"
    if fmt == "garbage":
        return f"I cannot produce a structured review for revision {revision} right now."
    return body


def _quoted(opts: SimOptions, prompt: str) -> str:
    """What a critic quoting the reviewed text writes before its verdict."""
    lines = [line for line in prompt.splitlines() if '"score"' in line]
    if opts.format == "fenced":
        return "The output holds:\n```\n" + "\n".join(lines) + "\n```\n"
    return "".join(f"The output holds `{line}`.\n" for line in lines)


def _quoted_between_markers(prompt: str) -> str:
    """The scored lines of ``prompt`` between the markers it fences its output with."""
    found = _MARKER.search(prompt)
    if found is None:
        return ""
    lines = "\n".join(line for line in prompt.splitlines() if '"score"' in line)
    return f"\nThe output reads:\n{found[0]}\n{lines}\n{found[0].replace('<<<', '<<<END-')}\n"


def _reviewed_output(prompt: str) -> str:
    """The output a critic's prompt fences between its markers (the whole prompt without)."""
    found = _MARKER.search(prompt)
    if found is None:
        return prompt
    end = prompt.find(found[0].replace("<<<", "<<<END-"), found.end())
    return prompt[found.end() : end if end >= 0 else None]


def _default_arguments(schema: dict[str, Any], prompt: str) -> dict[str, Any]:
    """Arguments for each required parameter of ``schema``: the output under review for a
    string, a neutral value for the rest."""
    props = schema.get("properties") or {}
    values: dict[str, Any] = {
        "string": _reviewed_output(prompt).strip("\n"),
        "integer": 1,
        "number": 1,
        "boolean": False,
        "array": [],
        "object": {},
    }
    return {
        name: values.get(str((props.get(name) or {}).get("type")), "")
        for name in schema.get("required") or []
    }


def _tool_turn(opts: SimOptions, tools: list[dict[str, Any]], prompt: str, turn: int) -> Completion:
    """A turn that calls tools: those ``call`` names (the first offered by default)."""
    offered = {t["name"]: t for t in tools}
    names = list(opts.call) if opts.call is not None else [tools[0]["name"]]
    scripted = {k: json.loads(v) for k, v in opts.args}
    asked: list[tuple[str, dict[str, Any]]] = []
    for name in names:
        given = scripted.get(name)
        if isinstance(given, list):  # one call per arguments object
            asked += [(name, a) for a in given]
        else:
            schema = (offered.get(name) or {}).get("parameters") or {}
            asked.append((name, given if given is not None else _default_arguments(schema, prompt)))
    calls = tuple(
        ToolCall(f"sim_{_digest(prompt + name) % 10**10:010d}_{turn}_{i}", name, arguments)
        for i, (name, arguments) in enumerate(asked)
    )
    text = "Checking with " + ", ".join(names) + "."
    return Completion(
        text=text,
        input_tokens=max(1, math.ceil(len(prompt) / 4)),
        output_tokens=tokens(text + json.dumps([c.arguments for c in calls])),
        stop_reason="end",
        raw_stop_reason="tool_calls",
        tool_calls=calls,
    )


def _quotes(results: list[Message]) -> list[str]:
    """What each tool result says, in a line: the first lines of its data."""
    quoted = []
    for m in results:
        lines = [
            " ".join(ln.strip("=-_ ").split())
            for ln in _reviewed_output(m["content"]).strip("\n").splitlines()
        ]
        head = " | ".join([ln for ln in lines if ln][:_QUOTED_LINES])[:_QUOTED_CHARS]
        quoted.append(f"Tool {m.get('name', '?')} reports: {head}")
    return quoted


def simulate(
    model: str,
    messages: list[Message],
    max_tokens: int,
    system: str = "",
    tools: list[dict[str, Any]] | None = None,
) -> Completion:
    """The simulated model's whole behaviour: a pure function of its input. ``tools``:
    the tools offered (``name``, ``parameters``), vendor-neutral."""
    opts = parse_sim_model(model)
    # The prompt is the last user message; tool turns and results may follow it.
    at = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    last = messages[at]["content"] if at >= 0 else ""
    after = messages[at + 1 :] if at >= 0 else []
    turns_taken = sum(1 for m in after if m["role"] == "assistant" and m.get("tool_calls"))
    results = [m for m in after if m["role"] == "tool"]
    wants = opts.call is None or bool(opts.call)
    if tools and wants and turns_taken < opts.tool_turns:
        return _tool_turn(opts, tools, last, turns_taken + 1)
    if opts.role == "critic":
        revision = max(_revision_in(last), 0)
    else:
        seen = _revision_in(last)
        revision = seen + 1 if seen >= 0 else 0
    if opts.fail_at is not None and revision == opts.fail_at:
        transient, status = _FAILURES[opts.fail]
        raise ProviderError(
            f"sim: simulated {opts.fail} (HTTP {status}) at revision {revision}",
            kind=opts.fail,
            transient=transient,
            status_code=status,
        )
    quotes = _quotes(results)
    if opts.role == "critic":
        clean = bool(opts.when) and opts.when not in _reviewed_output(last)
        score = 1.0 if clean else _critic_score(opts, last, revision)
        text = _critic_reply(opts, score, revision, quotes)
        if opts.quote == "before":
            text = _quoted(opts, last) + text
        elif opts.quote == "after":
            text += _quoted_between_markers(last)
    else:
        text = (_echo_reply if opts.echo else _actor_reply)(opts, last, revision)
        text += "".join(f"{q}\n" for q in quotes)
    stop = "end"
    limit = (
        max_tokens
        if opts.truncate_at is None or opts.truncate_at != revision
        else tokens(text) // 2
    )
    if tokens(text) > limit:
        text, stop = text[: limit * 4], "max_tokens"
    if opts.refuse_at is not None and opts.refuse_at == revision:
        stop = opts.refuse
        text = REFUSAL_TEXT if stop == "refusal" else text[: len(text) // 2]
    prompt_chars = len(system) + sum(len(m["content"]) for m in messages)
    prompt_chars += len(json.dumps(tools)) if tools else 0
    return Completion(
        text=text,
        input_tokens=max(1, math.ceil(prompt_chars / 4)),
        output_tokens=tokens(text),
        stop_reason=stop,  # type: ignore[arg-type]
        raw_stop_reason=stop,
    )


#: ``format`` values with which an actor's structured answer breaks its schema.
_BROKEN_FORMATS = ("garbage", "text", "prose")


def schema_example(schema: dict[str, Any], text: str) -> Any:
    """An instance of the JSON ``schema`` (every string ``text``): what the simulated actor
    answers when it is given an ``output_schema``. Follows ``$ref`` into ``$defs``."""
    defs = schema.get("$defs") or schema.get("definitions") or {}

    def build(node: Any, depth: int) -> Any:
        if not isinstance(node, dict) or depth > 20:
            return None
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
            return build(defs.get(ref.rsplit("/", 1)[-1]), depth + 1)
        if "const" in node:
            return node["const"]
        if node.get("enum"):
            return node["enum"][0]
        for key in ("anyOf", "oneOf", "allOf"):
            if node.get(key):
                return build(node[key][0], depth + 1)
        kind = node.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind == "object" or "properties" in node:
            props = node.get("properties") or {}
            return {k: build(v, depth + 1) for k, v in props.items()}
        if kind == "array":
            return [build(node.get("items") or {}, depth + 1)] * max(1, node.get("minItems", 1))
        if kind == "integer":
            return int(node.get("minimum", 0))
        if kind == "number":
            return float(node.get("minimum", 0.0))
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return text

    return build(schema, 0)


def structured_reply(model: str, schema: dict[str, Any], text: str) -> dict[str, Any] | str:
    """The simulated actor's answer to an ``output_schema``: an instance of it, or with
    ``format=garbage|text|prose`` its plain text (which breaks the schema)."""
    if parse_sim_model(model).format in _BROKEN_FORMATS:
        return text
    value = schema_example(schema, text)
    return value if isinstance(value, dict) else {}


class SimProvider(Provider):
    """In-process simulated model (see module docstring)."""

    name = "sim"

    def _call(self, agent: AgentSpec, messages: list[Message], structured: bool) -> Completion:
        # The simulator's replies are text: its ``format`` option says how they look.
        tools = [{"name": t.name, "parameters": t.parameters} for t in agent.tool_specs]
        completion = simulate(
            agent.model_name, messages, agent.max_tokens, agent.instructions, tools or None
        )
        latency = parse_sim_model(agent.model_name).latency_ms
        if latency > 0:
            time.sleep(latency / 1000)
        schema = agent.output_schema
        if schema is not None and completion.stop_reason == "end" and not completion.tool_calls:
            reply = structured_reply(agent.model_name, schema, completion.text)
            text = reply if isinstance(reply, str) else json.dumps(reply)
            completion = dataclasses.replace(completion, text=text, output_tokens=tokens(text))
        return completion


def preload() -> None:
    """Nothing to import: the simulator is part of Duet."""
