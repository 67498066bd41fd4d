"""Whole-run entries of the model-call cache, the pure part: when a run may have one, and
its key. Pure.

A finished run's record is a function of its loop spec (agents with their settings and
key variables' names, loop settings, templates, conversation settings), the SDKs its
calls go through and its prompt — as long as its conversations are its own. A run that
continues a user's conversation (``memory = "per_user"`` with a ``user_id``) depends on
that history too, so it never gets one; nor does a loop whose agent refuses the cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

from orchestration.core.memory import conversation_scope
from orchestration.core.results import RunResult, UsageReport

if TYPE_CHECKING:
    from orchestration.core.architecture import LoopSpec

#: Keys of whole-run entries start with this (the call entries' keys are bare hex), so
#: one store and ``duet cache stats|clear`` hold both.
RUN_KEY_PREFIX = "run:"
#: Bumped when what a run key covers or what a run entry holds changes (2: entries carry
#: an integrity tag).
RUN_KEY_VERSION = 2
#: Keys of whole-run *results* (a worker keeps a finished run's ``RunResult`` under one;
#: ``Team.submit_batch`` serves it) start with this: ``duet run`` keeps its own records,
#: in another shape, under :data:`RUN_KEY_PREFIX`.
RESULT_KEY_PREFIX = "result:"
#: The statuses of a run that finished well: only such a run is kept and served.
FINISHED_WELL = ("approved", "max_rounds_reached")


@functools.cache
def api_version(provider: str) -> str:
    """The SDK a provider's calls go through, with its version (``openai==1.40.0``)."""
    if provider == "sim":
        return "sim"
    try:
        return f"{provider}=={metadata.version(provider)}"
    except metadata.PackageNotFoundError:
        return provider


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


def result_key(spec: LoopSpec, prompt: str) -> str:
    """The key of a run's kept ``RunResult``: :func:`run_key` of the same run, with the
    SDKs it would call through now and :data:`RESULT_KEY_PREFIX`."""
    api = (api_version(spec.actor.provider), api_version(spec.critic.provider))
    return RESULT_KEY_PREFIX + run_key(spec, prompt, api)[len(RUN_KEY_PREFIX) :]


def served_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """A record's usage as a run served from the cache bills it: nothing, its calls counted
    as ``cached_calls`` and its cost as ``saved_usd`` (the role breakdown likewise)."""
    out: dict[str, Any] = {
        **usage,
        "input_tokens": 0,
        "output_tokens": 0,
        "calls": 0,
        "usd": 0.0,
        "cached_calls": int(usage.get("cached_calls") or 0) + int(usage.get("calls") or 0),
        "saved_usd": round(
            float(usage.get("saved_usd") or 0.0) + float(usage.get("usd") or 0.0), 6
        ),
    }
    if isinstance(usage.get("by_role"), Mapping):
        out["by_role"] = {role: served_usage(u) for role, u in usage["by_role"].items()}
    return out


def kept_result(result: RunResult) -> str:
    """What a run's cache entry holds: its result, without what belongs to the input or to
    this one run (ids, metadata, times, events)."""
    return result.model_copy(
        update={
            "run_id": "",
            "input_id": None,
            "batch_id": None,
            "user_id": None,
            "metadata": {},
            "created_at": None,
            "started_at": None,
            "finished_at": None,
            "events": [],
        }
    ).model_dump_json()


def served_result(text: str | None) -> str | None:
    """The ``RunResult`` JSON a run is served from the entry ``text`` holds, billed as
    nothing (:func:`served_usage`); None when it holds none that finished well (a miss)."""
    if text is None:
        return None
    try:
        result = RunResult.model_validate_json(text)
    except ValueError:
        return None
    if result.status not in FINISHED_WELL:
        return None
    usage = UsageReport.model_validate(
        {
            "total": served_usage(result.usage.total.model_dump()),
            "by_role": {r: served_usage(u.model_dump()) for r, u in result.usage.by_role.items()},
        }
    )
    return result.model_copy(update={"usage": usage, "cached": True}).model_dump_json()


__all__ = [
    "FINISHED_WELL",
    "kept_result",
    "served_result",
    "RESULT_KEY_PREFIX",
    "RUN_KEY_PREFIX",
    "api_version",
    "loop_cacheable",
    "result_key",
    "run_cacheable",
    "run_key",
    "served_usage",
]
