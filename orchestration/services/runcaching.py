"""The worker's side of whole-run cache entries: a run of a cacheable loop that finished
well keeps its ``RunResult`` in the model-call cache's store, under its
:func:`~orchestration.core.runcache.result_key`, for ``Team.submit_batch`` to serve."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from orchestration.core.runcache import FINISHED_WELL, kept_result, result_key, run_cacheable
from orchestration.state.callcache import STORE_ERRORS, CallStore
from orchestration.state.runs import RunStore

log = logging.getLogger(__name__)
#: What keeping a result may raise: a broken store, or a run or spec gone (expired).
KEEP_ERRORS: tuple[type[BaseException], ...] = (*STORE_ERRORS, LookupError)


class ResultKeeper:
    """Keeps the results of runs that finished well; a failure only logs."""

    def __init__(self, store: CallStore) -> None:
        self.store = store

    def finished(self, runs: RunStore, run: Mapping[str, str], status: str) -> bool:
        """Keep ``run``'s result if it finished well and its loop and user allow it;
        whether it was kept."""
        if status not in FINISHED_WELL:
            return False
        try:
            spec = runs.load_spec(run["spec_id"])
            if spec.cache is None or not run_cacheable(spec, run.get("user_id")):
                return False
            text = kept_result(runs.result(run["run_id"]))
            self.store.put(
                result_key(spec, run["prompt"]),
                text,
                max_entries=spec.cache.max_entries,
                max_bytes=spec.cache.max_bytes,
            )
        except KEEP_ERRORS as exc:
            log.warning("run cache write failed (%s)", type(exc).__name__)
            return False
        return True


__all__ = ["ResultKeeper"]
