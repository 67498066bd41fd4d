"""Whole runs served from the cache through ``Team.submit_batch`` on a real worker: a rerun
sends no task message for a cached run, its results equal the first run's, and an entry
whose integrity tag does not verify is a miss (the run runs)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from bench.harness import monitored
from orchestration import Agent, Team
from orchestration.core.results import RunResult
from orchestration.core.runcache import result_key, served_result
from orchestration.state.callcache import RedisCallStore, open_call_store
from tests.support import celery_worker, client_pointed_at, environment, wait_for

pytestmark = pytest.mark.system

#: A db of its own, and a worker of its own that shares this test's fleet key.
RUN_CACHE_DB = 8
FLEET_KEY = "test-fleet-key-" + "0" * 48
TTL_S = 7 * 86400.0


@pytest.fixture
def keyed_worker(redis_url: str) -> Iterator[str]:
    url = f"{redis_url.rpartition('/')[0]}/{RUN_CACHE_DB}"
    redis.Redis.from_url(url).flushdb()
    env = {"DUET_FLEET_KEY": FLEET_KEY}
    with (
        environment(dict(env)),
        celery_worker(url, concurrency=4, name="runcache", env=env),
        client_pointed_at(url),
    ):
        yield url


def _team() -> Team:
    return Team.actor_critic(
        actor=Agent("Fix.", model="sim"),
        critic=Agent("Review.", model="sim?scores=0.3,0.95"),
        max_rounds=3,
        cache="7d",
    )


def _kept(client: Any, team: Team, prompts: list[str]) -> bool:
    """Whether every prompt's run has a valid entry (the worker writes it just after the
    run's finish, which results() may see first)."""
    store = open_call_store(client, "redis://set", FLEET_KEY)
    found = store.get_many([result_key(team.spec, p) for p in prompts], TTL_S)
    return all(served_result(text) is not None for text in found)


def _pushes(seen: list[Any]) -> int:
    """Task messages published while monitored: every one is an ``LPUSH`` on a queue (a
    client's ``send_task`` or a transition script's)."""
    return sum(1 for _, cmd, _ in seen if cmd == "lpush")


def _same(a: RunResult, b: RunResult) -> bool:
    return (a.status, a.final_score, a.output) == (b.status, b.final_score, b.output)


def test_a_cached_rerun_sends_no_task_and_a_tampered_entry_runs(keyed_worker: str) -> None:
    client = redis.Redis.from_url(keyed_worker, decode_responses=True)
    team = _team()
    tag = uuid.uuid4().hex[:8]
    prompts = [f"print({n}, '{tag}')" for n in range(4)]
    items = [{"id": f"i{n}", "prompt": p} for n, p in enumerate(prompts)]

    with monitored(client) as seen:
        first = list(team.submit_batch(items).results(timeout=90))
    assert _pushes(seen) > 0  # the count sees task messages when there are some
    assert [r.cached for r in first] == [False] * 4
    assert [(r.status, r.error, r.usage.total.calls > 0) for r in first] == [
        ("approved", None, True)
    ] * 4
    wait_for(lambda: _kept(client, team, prompts), 30, "every run's result kept")

    # Entry 0 altered (its output) under its old tag: not served, the run runs.
    raw = RedisCallStore(client)
    key0 = result_key(team.spec, prompts[0])
    version, tag0, value = (raw.get(key0, TTL_S) or "").split(":", 2)
    doc = json.loads(value)
    doc["output"] = "import os; os.system('rm -rf /')"
    raw.put(key0, f"{version}:{tag0}:{json.dumps(doc)}", max_entries=1000, max_bytes=10**7)
    with monitored(client) as seen:
        second = team.submit_batch(items)
        rerun = list(second.results(timeout=90))
    assert _pushes(seen) > 0
    assert [r.cached for r in rerun] == [False, True, True, True]
    assert all(_same(a, b) for a, b in zip(first, rerun, strict=True))
    assert [r.input_id for r in rerun] == ["i0", "i1", "i2", "i3"]
    wait_for(lambda: _kept(client, team, prompts), 30, "entry 0 kept again")

    # Every entry valid: the rerun publishes no task message at all.
    with monitored(client) as seen:
        third = team.submit_batch(items)
        cached = list(third.results(timeout=30))
    assert _pushes(seen) == 0
    assert [r.cached for r in cached] == [True] * 4
    assert all(_same(a, b) for a, b in zip(first, cached, strict=True))
    assert [r.input_id for r in cached] == ["i0", "i1", "i2", "i3"]
    for was, now in zip(first, cached, strict=True):
        assert now.usage.total.calls == 0 and now.usage.total.usd == 0.0
        assert now.usage.total.cached_calls == was.usage.total.calls
        assert now.run_id != was.run_id and now.batch_id == third.batch_id
    progress = third.progress()
    assert (progress["done"], progress["total"]) == (4, 4)
    assert progress["counts"] == {"approved": 4}
    assert (progress["calls"], progress["usd"]) == (0, 0.0)
