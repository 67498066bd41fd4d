"""The offline simulated model: deterministic, stateless, no network.

Model strings: ``sim``, ``sim?latency_ms=20``, ``sim:critic?scores=0.3,0.6,0.95&format=fenced``.
The part after ``sim:`` is the role (``actor`` or ``critic``); the loop fills it in from
the agent's place when it is left out. Options (any role):

``latency_ms``   sleep this long per call, like a model's wall time (default 0)
``scores``       critic: score for revision 0, 1, 2...; the last repeats (default: from a
                 hash of the prompt in [0.35, 0.95], +0.2 a revision, so a batch has variety)
``format``       critic reply: ``json`` (default), ``fenced``, ``prose``, ``fraction``
                 (``"7/10"``), ``percent`` (``"85%"``), ``text`` (no JSON, ``Score: 9/10``),
                 ``garbage`` (no JSON, no score)
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

The actor marks each revision (``[revision N]``); the critic scores by the revision it
reads. Both depend only on their input, so any worker — or the stand-in HTTP server —
gives the same answer. Usage is counted as one token per four characters.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import parse_qsl

from orchestration.core.agents import AgentSpec
from orchestration.core.errors import ConfigError, ProviderError
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


def _critic_reply(opts: SimOptions, score: float, revision: int) -> str:
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


def simulate(model: str, messages: list[Message], max_tokens: int, system: str = "") -> Completion:
    """The simulated model's whole behaviour: a pure function of its input."""
    opts = parse_sim_model(model)
    last = messages[-1]["content"] if messages else ""
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
    if opts.role == "critic":
        clean = bool(opts.when) and opts.when not in _reviewed_output(last)
        score = 1.0 if clean else _critic_score(opts, last, revision)
        text = _critic_reply(opts, score, revision)
        if opts.quote == "before":
            text = _quoted(opts, last) + text
        elif opts.quote == "after":
            text += _quoted_between_markers(last)
    else:
        text = (_echo_reply if opts.echo else _actor_reply)(opts, last, revision)
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
    return Completion(
        text=text,
        input_tokens=max(1, math.ceil(prompt_chars / 4)),
        output_tokens=tokens(text),
        stop_reason=stop,  # type: ignore[arg-type]
        raw_stop_reason=stop,
    )


class SimProvider(Provider):
    """In-process simulated model (see module docstring)."""

    name = "sim"

    def _call(self, agent: AgentSpec, messages: list[Message], structured: bool) -> Completion:
        # The simulator's replies are text: its ``format`` option says how they look.
        completion = simulate(agent.model_name, messages, agent.max_tokens, agent.instructions)
        latency = parse_sim_model(agent.model_name).latency_ms
        if latency > 0:
            time.sleep(latency / 1000)
        return completion


def preload() -> None:
    """Nothing to import: the simulator is part of Duet."""
