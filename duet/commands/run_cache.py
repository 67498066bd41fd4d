"""Whole-run entries of the model-call cache, for ``duet run``: an input whose run finished
well before — same loop, same prompt, within the cache's TTL — gets that run's record
again, marked as served from the cache, without anything being submitted.

With the cache on, ``duet run`` keeps the record of each run that finishes well
(approved or out of rounds) under the run's key (:mod:`orchestration.core.runcache`), in
the same store as the cached calls, so ``duet cache stats|clear`` cover both. A rerun
looks every input up before it starts anything; when all hit it starts no Redis and no
worker. A served record bills nothing: its calls are counted as ``cached_calls`` and its
cost as ``saved_usd``, as call-level hits are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from duet.report.records import FINISHED_WELL
from orchestration.core.runcache import loop_cacheable, run_cacheable, run_key, served_usage
from orchestration.logjson import json_line

if TYPE_CHECKING:
    from orchestration.core.architecture import LoopSpec
    from orchestration.state.callcache import CallStore

log = logging.getLogger(__name__)

#: Fields of a record that belong to the input, not to the run: replaced when served.
INPUT_FIELDS = ("index", "id", "user_id", "metadata")


def served_record(stored: Mapping[str, Any], index: int, item: Mapping[str, Any]) -> dict[str, Any]:
    """The results record of input ``item`` (at ``index``) served from a stored run's."""
    return {
        **stored,
        "index": index,
        "id": item.get("id"),
        "user_id": item.get("user_id"),
        "metadata": item.get("metadata"),
        "cached": True,
        "usage": served_usage(stored.get("usage") or {}),
    }


def _stored_of(text: str | None) -> dict[str, Any] | None:
    """The record stored as ``text``; None when it is not one (a damaged entry)."""
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("status") not in FINISHED_WELL:
        return None
    return record


class RunCache:
    """Looks inputs up before a batch is submitted and keeps the records of its runs."""

    def __init__(self, spec: LoopSpec, store: CallStore) -> None:
        from orchestration.services.callcaching import STORE_ERRORS, api_version

        assert spec.cache is not None
        self.spec = spec
        self.store = store
        self.cache = spec.cache
        self.api = (api_version(spec.actor.provider), api_version(spec.critic.provider))
        self.errors = STORE_ERRORS
        #: The key of each input looked up and missed, by its index: kept when it finishes.
        self._keys: dict[int, str] = {}
        self._pending: list[tuple[str, str]] = []

    @classmethod
    def of(cls, spec: LoopSpec) -> RunCache | None:
        """The run cache of ``spec``; None when the loop has the cache off or an agent
        refuses it."""
        if not loop_cacheable(spec):
            return None
        from duet.commands.cache import cache_store

        return cls(spec, cache_store())

    def lookup(self, items: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[int, dict[str, Any]]:
        """Of ``(index, submit item)``, the records of those served from the cache, by
        index (one lookup for all); a store that fails serves nothing."""
        keyed = [
            (index, item, run_key(self.spec, item["prompt"], self.api))
            for index, item in items
            if run_cacheable(self.spec, item.get("user_id"))
        ]
        try:
            texts = self.store.get_many([key for _, _, key in keyed], self.cache.ttl_s)
        except self.errors as exc:
            log.warning("run cache lookup failed (%s): running every input", type(exc).__name__)
            texts = [None] * len(keyed)
        served = {}
        for (index, item, key), text in zip(keyed, texts, strict=True):
            stored = _stored_of(text)
            if stored is None:
                self._keys[index] = key
            else:
                served[index] = served_record(stored, index, item)
        return served

    def finished(self, record: Mapping[str, Any]) -> None:
        """Note a record written to the results file: a run looked up, missed, and now
        finished well is kept (by :meth:`flush`)."""
        index = record.get("index")
        key = self._keys.pop(index, None) if isinstance(index, int) else None
        if key is not None and record.get("status") in FINISHED_WELL and not record.get("cached"):
            stored = {k: v for k, v in record.items() if k not in INPUT_FIELDS}
            self._pending.append((key, json_line(stored)))

    def flush(self) -> int:
        """Store the records noted since the last flush (one write); how many."""
        pending, self._pending = self._pending, []
        if not pending:
            return 0
        try:
            self.store.put_many(
                pending,
                max_entries=self.cache.max_entries,
                max_bytes=self.cache.max_bytes,
            )
        except self.errors as exc:
            log.warning("run cache write failed (%s)", type(exc).__name__)
            return 0
        return len(pending)


__all__ = ["RunCache", "served_record", "served_usage"]
