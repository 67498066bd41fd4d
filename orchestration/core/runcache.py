"""Whole-run entries of the model-call cache, the pure part: when a run may have one, and
its key. Pure.

A finished run's record is a function of its loop spec (agents with their settings and
key variables' names, loop settings, templates, conversation settings), the SDKs its
calls go through and its prompt — as long as its conversations are its own. A run that
continues a user's conversation (``memory = "per_user"`` with a ``user_id``) depends on
that history too, so it never gets one; nor does a loop whose agent refuses the cache.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from orchestration.core.memory import conversation_scope

if TYPE_CHECKING:
    from orchestration.core.architecture import LoopSpec

#: Keys of whole-run entries start with this (the call entries' keys are bare hex), so
#: one store and ``duet cache stats|clear`` hold both.
RUN_KEY_PREFIX = "run:"
#: Bumped when what a run key covers or what a run entry holds changes (2: entries carry
#: an integrity tag).
RUN_KEY_VERSION = 2


def loop_cacheable(spec: LoopSpec) -> bool:
    """Whether runs of ``spec`` may have whole-run entries: the loop has the cache on and
    neither agent refuses it."""
    return spec.cache is not None and spec.actor.cache and spec.critic.cache


def run_cacheable(spec: LoopSpec, user_id: str | None) -> bool:
    """Whether a batch input with ``user_id`` may have a whole-run entry: the loop's, and
    the run keeps conversations of its own (or none)."""
    if not loop_cacheable(spec):
        return False
    if not spec.persistent_subagents:
        return True
    scope = conversation_scope(spec.memory, run_id="-", user_id=user_id, batch_id="-")
    return scope.startswith("run:")


def run_key(spec: LoopSpec, prompt: str, api_versions: tuple[str, str]) -> str:
    """The key of a run of ``spec`` on ``prompt``: hex sha256 of canonical JSON of the spec
    (its cache settings left out: a TTL does not change an answer), the actor's and the
    critic's SDK versions, and the prompt."""
    doc = {
        "v": RUN_KEY_VERSION,
        "spec": spec.model_dump(mode="json", exclude={"cache"}),
        "api": list(api_versions),
        "prompt": prompt,
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return RUN_KEY_PREFIX + hashlib.sha256(text.encode()).hexdigest()


__all__ = ["RUN_KEY_PREFIX", "loop_cacheable", "run_cacheable", "run_key"]
