"""Whole runs served from the cache at submit: ``Team.submit_batch`` looks every input up
(one read) before it starts anything; a hit is written finished and sent to no worker."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from orchestration.core.architecture import LoopSpec
from orchestration.core.runcache import result_key, run_cacheable, served_result
from orchestration.settings import get_settings
from orchestration.state import connection
from orchestration.state.callcache import STORE_ERRORS, open_call_store
from orchestration.state.runs import RunRecord

log = logging.getLogger(__name__)


def served_from_cache(spec: LoopSpec, records: Sequence[RunRecord]) -> list[RunRecord]:
    """``records``, those whose run has a kept result given it as ``served``; a store that
    fails, or an entry that is damaged or untagged, serves nothing (the run runs)."""
    out = list(records)
    keyed = [
        (n, result_key(spec, r.prompt)) for n, r in enumerate(out) if run_cacheable(spec, r.user_id)
    ]
    if not keyed or spec.cache is None:
        return out
    settings = get_settings()
    store = open_call_store(connection.get_redis(), settings.redis_url, settings.fleet_key_value())
    try:
        texts = store.get_many([key for _, key in keyed], spec.cache.ttl_s)
    except STORE_ERRORS as exc:
        log.warning("run cache lookup failed (%s): running every input", type(exc).__name__)
        return out
    for (n, _), text in zip(keyed, texts, strict=True):
        served = served_result(text)
        if served is not None:
            out[n] = replace(out[n], served=served, gate=None)
    return out


__all__ = ["served_from_cache"]
