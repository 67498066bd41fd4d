"""Persistent subagent conversations: each worker's history per team and user (or run).

With ``persistent_subagents`` (the default of ``Team.actor_critic``) the actor and the
critic each keep a conversation across rounds and runs, so any worker can continue it.
Its key (:func:`keys.conversation`) names the team, the role's worker and the scope that
:func:`orchestration.core.memory.conversation_scope` chooses: a user (``user:<id>``) or
one run (``run:<id>``; a run without a user, and each batch input unless the team asks
for per-user memory). Two teams of one user, or two inputs of a batch, share nothing.

A user's conversation is a Redis list with one element per *turn*: the prompt a step
sent and the reply it got, stored together so the history always alternates user /
assistant. A run's own conversation (scope ``run:<id>``) is no list: its turns are the
run's earlier steps of the role, whose inputs and results the run keeps anyway; the begin
script reads them with the step (:func:`own_turns`), under the same rules (whole, not
empty, the last turns kept, bounded by tokens).
A turn is appended by the script that stores the step's result, only when that result
is the one stored.
Lists are bounded by turns (``LTRIM``, oldest dropped first) and by tokens (the step's
store script drops the oldest turns of other runs down to half the bound; the reader,
:func:`messages_from`, keeps within it), and expire when left alone for the store's TTL.
A reply cut at ``max_tokens``, a refusal, a filtered reply or a context overflow is never
stored.

There is no lock. Runs of different users never wait on each other; two runs of the
*same* user that overlap read the history as it stands when each step starts and append
their turns as they finish, so their turns interleave and one may not see the other's
latest turn. Each stored turn names its step, and a turn stored twice (a step whose
model call was repeated after its claim expired) is read once.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from orchestration.core.completion import UNFINISHED, Message
from orchestration.core.memory import Turn, bounded, turn_step


def history(client: Any, key: str, turns: int) -> list[Message]:
    """The last ``turns`` turns of the conversation at ``key``, as messages.

    Steps read their history inside their begin script and append their turn inside the
    script that stores their result (``lua/step_begin.lua``, ``lua/step_complete.lua``);
    this is the same read for everyone else (``duet show``, tests).
    """
    if turns < 1:
        return []
    return messages_from(client.lrange(key, -turns, -1))


def keeps(turns: int, reply: str) -> bool:
    """Whether a turn with this reply is stored: not when no turns are kept, nor an
    empty reply (an empty assistant message makes the vendors refuse every later call)."""
    return turns >= 1 and bool(reply.strip())


def turn_json(step_id: str, prompt: str, reply: str) -> str:
    """One stored turn: the step that made it, the prompt it sent, the reply it got."""
    return json.dumps({"s": step_id, "u": prompt, "a": reply}, separators=(",", ":"))


def turn_prefix(run_id: str) -> str:
    """How every stored turn of run ``run_id`` begins (the store's scripts test it)."""
    return '{"s":' + json.dumps(turn_step(run_id, ""))[:-1]


def own_turns(run_id: str, earlier: list[tuple[str, str, str]], turns: int) -> list[Turn]:
    """A conversation that is the run's own (scope ``run:<id>``), from the run's earlier
    steps of the role ``(step key, input JSON, stored result JSON)``: each stored step
    whose answer is a turn a list would have kept (whole, not empty) is one, its input's
    prompt and its reply; the last ``turns`` of them."""
    found = []
    for key, raw_input, raw_result in earlier:
        if not raw_input or not raw_result:
            continue
        result = json.loads(raw_result)
        text = result.get("text")
        if text is None or result.get("stop_reason") in UNFINISHED or not keeps(turns, text):
            continue
        found.append(Turn(turn_step(run_id, key), json.loads(raw_input)["prompt"], text))
    return found[-turns:] if turns >= 1 else []


def messages_from(
    raw: list[Any] | list[Turn], *, max_tokens: int | None = None, run_id: str = ""
) -> list[Message]:
    """Stored turns (oldest first; raw as a list stores them, or :class:`Turn`) as
    alternating user / assistant messages.

    A turn stored twice is read once. With ``max_tokens`` the history is bounded as
    :func:`memory.bounded` says: earlier runs' oldest turns dropped first, run
    ``run_id``'s own turns kept.
    """
    turns = []
    for n, item in enumerate(raw):
        if isinstance(item, Turn):
            turns.append(item)
            continue
        turn = json.loads(item)
        turns.append(Turn(turn.get("s") or f"?{n}", turn["u"], turn["a"]))
    limit = sys.maxsize if max_tokens is None else max_tokens
    turns = bounded(turns, max_tokens=limit, run_id=run_id)
    messages: list[Message] = []
    for turn in turns:
        messages.append({"role": "user", "content": turn.prompt})
        messages.append({"role": "assistant", "content": turn.reply})
    return messages


__all__ = [
    "Message",
    "history",
    "keeps",
    "messages_from",
    "own_turns",
    "turn_json",
    "turn_prefix",
]
