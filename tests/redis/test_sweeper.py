"""The sweep's decisions on a real server: which unfinished runs it sends on, and what.

Runs are put in each state the sweep can find them in through the store (created, a step
recorded, begun with a claim, stored, finished); the clock is passed in, so "stopped
moving" is a value, not a wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestration.services.coordinator import Dispatch
from orchestration.services.sweeper import Sweeper, Transition
from orchestration.state import keys
from orchestration.state.runs import RunRecord, RunStore

AFTER_S = 100.0


@pytest.fixture
def store(redis_client: Any, redis_url: str) -> Iterator[RunStore]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield RunStore(client, finished_ttl_s=600)
    client.close()


def _create(store: RunStore, *run_ids: str) -> None:
    pipe = store.r.pipeline()
    store.create_runs([RunRecord(r, "spec", "p", batch_id="b1") for r in run_ids], pipe)
    pipe.execute()


def _step(store: RunStore, run_id: str) -> None:
    run = store.r.hgetall(keys.run(run_id))
    assert store.record_step(run, 0, "r0.generate", {"prompt": "p", "pause": "x"}, []) == 1


def test_what_the_sweep_sends(store: RunStore) -> None:
    _create(store, "queued", "lost-step", "in-flight", "stored", "done", "fresh")
    for run_id in ("lost-step", "in-flight", "stored", "done", "fresh"):
        _step(store, run_id)
    assert store.begin_step("in-flight", "r0.generate", "alive", 30, "{}").outcome == "go"
    assert store.begin_step("stored", "r0.generate", "c", 30, "{}").outcome == "go"
    result = {"key": "r0.generate", "text": "t", "calls": 1, "interrupted": None}
    assert store.complete_step("stored", "r0.generate", result, "{}", "c")
    run = store.r.hgetall(keys.run("done"))
    store.record_finish(run, 1, "approved", reason=None, error=None, usage={}, events=[])
    later = time.time() + AFTER_S + 1
    store.touch("fresh", later - 1)  # it moved a second before the sweep

    sends = Sweeper(store, after_s=AFTER_S).sweep(now=later)

    by_run = {s.run_id: s for s in sends}
    assert by_run["queued"] == Transition("queued", 0, "b1")
    assert by_run["lost-step"] == Dispatch(keys.TASK_GENERATE, "lost-step", "r0.generate", 1, "b1")
    assert by_run["stored"] == Transition("stored", 1, "b1")
    # A live claim, a finished run and a run that moved recently are left alone.
    assert set(by_run) == {"queued", "lost-step", "stored"}
    # Each run sent on is noted as moved: the next sweep within AFTER_S sends nothing.
    assert Sweeper(store, after_s=AFTER_S).sweep(now=later) == []
    assert store.r.zscore(keys.runs_moved(), "done") is None


def test_a_run_that_moved_since_its_index_time_is_not_sent(store: RunStore) -> None:
    """A transition notes its time in the record, not in the index: a run the index holds
    as old but whose record moved since is re-scored from the record and left alone."""
    _create(store, "moving", "stuck")
    _step(store, "moving")
    old = time.time() - AFTER_S - 50
    store.touch("moving", old)
    store.touch("stuck", old)
    now = old + AFTER_S + 10  # the step was recorded after now - AFTER_S

    sends = Sweeper(store, after_s=AFTER_S).sweep(now=now)

    assert [s.run_id for s in sends] == ["stuck"]
    moved_at = float(store.r.hget(keys.run("moving"), "moved_at"))
    assert store.r.zscore(keys.runs_moved(), "moving") == pytest.approx(moved_at)
