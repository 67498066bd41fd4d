"""What a persistent subagent remembers: whose conversation a step continues, and how much
of it the model is sent. Pure, no I/O.

A conversation belongs to a *team* (:attr:`LoopSpec.team_id`), a worker of that team (the
actor or the critic) and a *scope*: one user (``user:<id>``) or one run (``run:<id>``).
Which scope a run uses is :func:`conversation_scope`; how many of the stored turns a call
carries is :func:`bounded`: at most ``conversation_turns`` turns (the store trims to that)
and about ``conversation_max_tokens`` tokens, the oldest turns of earlier runs dropped
first, the current run's own turns always kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestration.core.errors import ConfigError

#: ``per_user``: a user's runs share the role's conversation. ``per_run``: each run has
#: its own. ``None`` (the default): per user for a single run with a ``user_id`` (the
#: spec's behaviour), per run for each input of a batch.
Memory = Literal["per_run", "per_user"]
MEMORIES: tuple[str, ...] = ("per_run", "per_user")

#: What a team or worker name may be: it becomes part of Redis keys and of what is shown.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: History is bounded by an estimate, not a tokenizer: about four characters a token.
CHARS_PER_TOKEN = 4


#: Turns kept per persistent conversation, when a team sets none.
DEFAULT_CONVERSATION_TURNS = 20
#: About how many tokens of history a call carries, when a team sets none: a few files.
DEFAULT_CONVERSATION_MAX_TOKENS = 4000


class ConversationSettings(BaseModel):
    """What a caller chooses for a team's conversations: the one place their bounds and
    defaults are written (``Team.actor_critic(...)`` and a config file's ``[loop]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str | None = None
    """The team's name (``"code-review"``): its conversations are its own. Unnamed, a
    team is identified by its actor, critic, settings and coordinator."""
    memory: Memory | None = None
    """Whose conversation a run continues: ``per_user``, ``per_run``, or None: per user
    for a single run with a ``user_id``, per run for each input of a batch."""
    conversation_turns: int = Field(default=DEFAULT_CONVERSATION_TURNS, ge=1)
    """Turns kept per conversation; the oldest are dropped first."""
    conversation_max_tokens: int = Field(default=DEFAULT_CONVERSATION_MAX_TOKENS, ge=1)
    """About how many tokens of earlier runs' history a call carries (the oldest turns
    are dropped first; the current run's own turns are always sent)."""

    @field_validator("name")
    @classmethod
    def _usable_name(cls, name: str | None) -> str | None:
        check_name(name, "")
        return name


def check_name(name: object, where: str) -> None:
    """Refuse a team or worker name that cannot be part of a key (ConfigError naming it)."""
    if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
        raise ConfigError(
            f"{where}: " * bool(where) + f"{name!r} must be 1-64 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )


def conversation_scope(
    memory: Memory | None, *, run_id: str, user_id: str | None, batch_id: str | None
) -> str:
    """The scope of a run's conversations: ``user:<id>`` or ``run:<id>``.

    A run without a user always keeps its own, so anonymous runs share nothing.
    """
    if not user_id or memory == "per_run":
        return f"run:{run_id}"
    if memory == "per_user" or not batch_id:
        return f"user:{user_id}"
    return f"run:{run_id}"  # a batch input, with the default memory


@dataclass(frozen=True, slots=True)
class Turn:
    """One stored turn: the step that made it, the prompt it sent, the reply it got."""

    step: str
    prompt: str
    reply: str

    @property
    def tokens(self) -> int:
        return estimate_tokens(self.prompt) + estimate_tokens(self.reply)


def estimate_tokens(text: str) -> int:
    """About how many tokens ``text`` is (:data:`CHARS_PER_TOKEN` characters a token)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def turn_step(run_id: str, step_key: str) -> str:
    """The id a stored turn carries: its run and step (``<run_id>/<step key>``)."""
    return f"{run_id}/{step_key}"


def bounded(turns: Sequence[Turn], *, max_tokens: int, run_id: str) -> list[Turn]:
    """The turns a call is sent, oldest first, within about ``max_tokens`` tokens.

    The oldest turns of *other* runs are dropped first until the rest fits; the turns of
    run ``run_id`` itself are always kept (the loop needs its own draft and critique), so
    those alone may exceed the bound. A turn stored twice (a repeated step) counts once.
    """
    unique: list[Turn] = []
    seen: set[str] = set()
    for turn in turns:
        if turn.step in seen:
            continue
        seen.add(turn.step)
        unique.append(turn)
    own_prefix = f"{run_id}/"
    total = sum(t.tokens for t in unique)
    kept: list[Turn] = []
    for n, turn in enumerate(unique):
        if total > max_tokens and not turn.step.startswith(own_prefix):
            total -= turn.tokens
            continue
        kept.append(turn)
        if total <= max_tokens:
            kept.extend(unique[n + 1 :])
            break
    return kept


__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_CONVERSATION_MAX_TOKENS",
    "DEFAULT_CONVERSATION_TURNS",
    "ConversationSettings",
    "MEMORIES",
    "Memory",
    "Turn",
    "bounded",
    "check_name",
    "conversation_scope",
    "estimate_tokens",
    "turn_step",
]
